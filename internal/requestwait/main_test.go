package requestwait

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: an
// abandoned read's goroutine (read) ends once its read returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
