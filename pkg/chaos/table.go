package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Table is the fault classes × invariants table of one or more reports
// (RELIABILITY.md): for each class, how many faults of it were injected,
// how many checks of each invariant fell in their windows and how many of
// those failed, and the longest recovery after one of them.
type Table struct {
	rows map[string]*tableRow
}

type tableRow struct {
	faults   int
	cells    map[string]Cell
	recovery time.Duration
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{rows: map[string]*tableRow{}} }

func (t *Table) row(class string) *tableRow {
	r := t.rows[class]
	if r == nil {
		r = &tableRow{cells: map[string]Cell{}}
		t.rows[class] = r
	}
	return r
}

// Add adds a report's figures.
func (t *Table) Add(r *Report) {
	for class, n := range r.Summary.Faults {
		t.row(class).faults += n
	}
	for class, cells := range r.ByClass {
		row := t.row(class)
		for inv, c := range cells {
			cur := row.cells[inv]
			cur.Checked += c.Checked
			cur.Violations += c.Violations
			row.cells[inv] = cur
		}
	}
	for class, d := range r.Recovery {
		row := t.row(class)
		row.recovery = max(row.recovery, d)
	}
}

// classOrder sorts classes as FaultClasses lists them (variants of a class
// together), NoFault last.
func classOrder(a, b string) bool {
	rank := func(c string) int {
		if c == NoFault {
			return len(FaultClasses) + 1
		}
		base, _, _ := strings.Cut(c, "/")
		for i, fc := range FaultClasses {
			if fc == base {
				return i
			}
		}
		return len(FaultClasses)
	}
	if ra, rb := rank(a), rank(b); ra != rb {
		return ra < rb
	}
	return a < b
}

// Markdown renders the table: a cell is the number of checks in the
// class's windows, with the violations among them when there are any.
func (t *Table) Markdown() string {
	var classes []string
	for c := range t.rows {
		classes = append(classes, c)
	}
	sort.Slice(classes, func(i, j int) bool { return classOrder(classes[i], classes[j]) })
	var b strings.Builder
	b.WriteString("| fault class | faults |")
	for _, inv := range invariantTitles {
		b.WriteString(" " + inv.name + " |")
	}
	b.WriteString(" longest recovery |\n|---|---|")
	for range invariantTitles {
		b.WriteString("---|")
	}
	b.WriteString("---|\n")
	for _, c := range classes {
		r := t.rows[c]
		faults := fmt.Sprint(r.faults)
		if c == NoFault {
			faults = "—"
		}
		fmt.Fprintf(&b, "| %s | %s |", c, faults)
		for _, inv := range invariantTitles {
			cell := r.cells[inv.name]
			switch {
			case cell.Checked == 0:
				b.WriteString(" — |")
			case cell.Violations == 0:
				fmt.Fprintf(&b, " %d ✓ |", cell.Checked)
			default:
				fmt.Fprintf(&b, " %d, **%d violated** |", cell.Checked, cell.Violations)
			}
		}
		rec := "—"
		if c != NoFault {
			rec = r.recovery.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, " %s |\n", rec)
	}
	return b.String()
}
