package acpbridge

import (
	"testing"

	"go.uber.org/goleak"
)

// Every session's goroutines (the SDK connection, the prompt, the writer,
// the process watchers) end once the session is closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
