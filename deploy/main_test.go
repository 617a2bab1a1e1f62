package deploy

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind, and
// removes the route certificates the tests generated (routeTLSDir).
func TestMain(m *testing.M) { goleak.VerifyTestMain(cleanupRun{m}) }

type cleanupRun struct{ m *testing.M }

func (c cleanupRun) Run() int {
	defer removeRouteTLS()
	return c.m.Run()
}
