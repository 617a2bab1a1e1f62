package coordinator

import (
	"context"
	"sort"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// childrenList lists a parent's children (or its descendants, in pre-order):
// identity from each child's own descriptor; a damaged child is a diagnostic
// row, never a failed list (docs/upstream-behaviour.md §5.15).
func (c *Coordinator) childrenList(ctx context.Context, req rpc.Request, r protocol.ChildrenListRequest) (protocol.ChildrenListReply, error) {
	if r.Parent == "" {
		return c.liveChildrenList(ctx, r)
	}
	if !protocol.ValidID(r.Parent) {
		return protocol.ChildrenListReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "parent must be a valid session id")
	}
	if err := c.authorizeListing(ctx, r); err != nil {
		return protocol.ChildrenListReply{}, err
	}
	rows, err := c.childRows(ctx, r.Parent, r.Descendants)
	if err != nil {
		return protocol.ChildrenListReply{}, protocol.Errorf(protocol.CodeUnavailable, "list children: %w", err)
	}
	return protocol.ChildrenListReply{Rows: rows}, nil
}

// childRows walks the child index from parent in creation order: its
// children, and with descendants their subtrees in pre-order (rows then say
// their parent and depth); at most ChildRowsMax rows, each session once.
func (c *Coordinator) childRows(ctx context.Context, parent string, descendants bool) ([]protocol.ChildRow, error) {
	rows := []protocol.ChildRow{}
	seen := map[string]bool{parent: true}
	var walk func(parent string, depth int) error
	walk = func(parent string, depth int) error {
		idx, err := c.st.ChildIndex(ctx, parent)
		if err != nil {
			return err
		}
		sortIndex(idx)
		for _, e := range idx {
			if seen[e.ChildID] || len(rows) >= ChildRowsMax {
				continue
			}
			seen[e.ChildID] = true
			row := c.childRow(ctx, e)
			if descendants {
				row.ParentID, row.Depth = parent, depth
			}
			sub, _ := c.st.ChildIndex(ctx, e.ChildID)
			row.HasChildren = len(sub) > 0
			rows = append(rows, row)
			if descendants && row.HasChildren {
				if err := walk(e.ChildID, depth+1); err != nil {
					return err
				}
			}
		}
		for _, row := range c.queuedRows(ctx, parent) {
			if seen[row.ID] || len(rows) >= ChildRowsMax {
				continue
			}
			seen[row.ID] = true
			if descendants {
				row.ParentID, row.Depth = parent, depth
			}
			rows = append(rows, row)
		}
		return nil
	}
	err := walk(parent, 1)
	return rows, err
}

// sortIndex orders a child index by creation (createdAt, then id): the
// index's own order is the order its entries were written, which for
// children started in parallel varies from run to run.
func sortIndex(idx []protocol.ChildIndexRecord) {
	sort.SliceStable(idx, func(i, j int) bool {
		if idx[i].CreatedAt != idx[j].CreatedAt {
			return idx[i].CreatedAt < idx[j].CreatedAt
		}
		return idx[i].ChildID < idx[j].ChildID
	})
}

// liveChildrenList answers children.list without a parent (user grant only):
// every continuable child with a live activation, whoever its parent, as
// rows with parentId and depth (from its ancestry), in creation order.
func (c *Coordinator) liveChildrenList(ctx context.Context, r protocol.ChildrenListRequest) (protocol.ChildrenListReply, error) {
	g, err := c.grantOf(ctx, r.Authority.Grant)
	if err != nil {
		return protocol.ChildrenListReply{}, err
	}
	if r.Descendants {
		return protocol.ChildrenListReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "descendants needs a parent")
	}
	// A grant of one user lists the activations in that user's trees.
	in := c.memoCovers(reader{grant: g}, "")
	rows := []protocol.ChildRow{}
	for _, l := range c.agents.snapshot() {
		if l.rec.Kind != protocol.AgentContinuable || !c.leaseLive(l.rec) || len(rows) >= ChildRowsMax {
			continue
		}
		if ok, err := in(ctx, l.rec.SessionID); err != nil || !ok {
			continue
		}
		row := c.childRow(ctx, protocol.ChildIndexRecord{ChildID: l.rec.SessionID, Mode: protocol.ModeContinuable, Provider: l.rec.Provider})
		row.ParentID, row.Depth = l.rec.ParentSession, len(l.rec.Ancestry)
		rows = append(rows, row)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].CreatedAt != rows[j].CreatedAt {
			return rows[i].CreatedAt < rows[j].CreatedAt
		}
		return rows[i].ID < rows[j].ID
	})
	return protocol.ChildrenListReply{Rows: rows}, nil
}

// ChildRowsMax bounds one listing.
const ChildRowsMax = 10000

func (c *Coordinator) childRow(ctx context.Context, e protocol.ChildIndexRecord) protocol.ChildRow {
	h, err := c.headers.get(ctx, c.st, e.ChildID)
	if err != nil {
		return protocol.ChildRow{Kind: protocol.RowDiagnostic, ID: e.ChildID, Reason: protocol.DiagnosticUnavailable}
	}
	row := protocol.ChildRow{Kind: protocol.RowChild, ID: e.ChildID, CreatedAt: h.CreatedAt, Activity: protocol.ActivityInactive, State: protocol.StateNone}
	if l, ok := c.agents.get(e.ChildID, h.Scope()); ok && c.leaseLive(l.rec) {
		row.Activity, row.State = protocol.ActivityRunning, protocol.StateRunning
	}
	log, err := c.st.ReadLog(ctx, h.Scope(), e.ChildID)
	if err != nil {
		return protocol.ChildRow{Kind: protocol.RowDiagnostic, ID: e.ChildID, Reason: protocol.DiagnosticUnavailable}
	}
	own := sessionlog.Own(log.Events, h.SeedLength)
	d, ok := sessionlog.ListedDescriptor(own)
	if !ok {
		if row.Activity == protocol.ActivityRunning {
			row.Kind, row.Reason = protocol.RowDiagnostic, protocol.DiagnosticCreating
			return row
		}
		if len(own) == 0 {
			// Nothing of its own was ever logged: a start refused (or
			// given up) after its header was written, not a damaged
			// child (issue 37, item 6).
			return protocol.ChildRow{Kind: protocol.RowDiagnostic, ID: e.ChildID, Reason: protocol.DiagnosticNotStarted,
				Mode: e.Mode, Provider: e.Provider, CreatedAt: h.CreatedAt}
		}
		return protocol.ChildRow{Kind: protocol.RowDiagnostic, ID: e.ChildID, Reason: protocol.DiagnosticCorrupt}
	}
	row.Mode, row.Label, row.Provider = d.Mode, d.Label, d.Provider
	usage := sessionlog.Usage(own)
	row.Usage = &usage
	if d.Mode == protocol.ModeOneShot {
		if _, ok := sessionlog.LastTurnEnd(own); ok && row.Activity == protocol.ActivityRunning {
			row.State = protocol.StateRunning
		}
	}
	if p, ok := sessionlog.Parked(own); ok && p.Budget != nil {
		// Paused at its budget's cap, whether or not an activation holds it
		// now (its turn is the log's).
		row.State = protocol.StatePaused
	}
	return row
}
