package acpagent

import (
	"context"

	acp "github.com/coder/acp-go-sdk"
)

// beginLoad serves two session/load of one session at once as one (issue
// 37, item 7): the first reopens the root; one that arrives meanwhile
// waits for it to end and then replays the session it opened, as a load of
// a session already open here does. Before, both reopened the root and the
// second was refused UNAVAILABLE ("live in another process": this one).
//
// It returns the session when it is open in this process (replay it), else
// done, which the caller, now the one load of id in progress, calls when it
// ended (whether it opened the session or failed: a waiting load then
// tries itself). A ctx done while waiting is the request's cancellation.
func (s *Service) beginLoad(ctx context.Context, id string) (*session, func(), error) {
	for {
		s.mu.Lock()
		if ss, ok := s.sessions[id]; ok {
			s.mu.Unlock()
			return ss, nil, nil
		}
		wait, busy := s.loading[id]
		if !busy {
			mine := make(chan struct{})
			s.loading[id] = mine
			s.mu.Unlock()
			return nil, func() {
				s.mu.Lock()
				delete(s.loading, id)
				s.mu.Unlock()
				close(mine)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, nil, acp.NewInternalError(map[string]any{"error": "session/load of " + id + " cancelled while another load of it was in progress"})
		}
	}
}
