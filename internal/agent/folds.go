package agent

import "github.com/brood-dev/brood/internal/sessionlog"

// The folds over a session log live in internal/sessionlog. These names
// stay only until the hosting and takeover code that issue 16 is still
// changing calls sessionlog itself (issue 13 then removes them).
var (
	OneShotOutcome    = sessionlog.OneShotOutcome
	EpochOutcome      = sessionlog.EpochOutcome
	LastTurnEnd       = sessionlog.LastTurnEnd
	CloseOpenTurn     = sessionlog.CloseOpenTurn
	EarlierOutputNote = sessionlog.EarlierOutputNote
)
