package acpagent_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	acpagent "github.com/brood-dev/brood/services/acp-agent"
)

// editor is an ACP client (the ACP Go SDK's client side) that counts the
// session/update notifications it gets and refuses everything else.
type editor struct {
	mu      sync.Mutex
	updates int
}

func (e *editor) SessionUpdate(context.Context, acp.SessionNotification) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.updates++
	return nil
}

func (e *editor) RequestPermission(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{Cancelled: &acp.RequestPermissionOutcomeCancelled{}}}, nil
}
func (e *editor) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsReadTextFile)
}
func (e *editor) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsWriteTextFile)
}
func (e *editor) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalCreate)
}
func (e *editor) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalKill)
}
func (e *editor) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalOutput)
}
func (e *editor) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalRelease)
}
func (e *editor) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalWaitForExit)
}

// serve runs an ACP agent server on s in this process (tools nil: the
// default tools), connected to an
// editor over pipes, initialized; it stops (the editor disconnects) when
// the test ends.
func serve(t *testing.T, s *stack.Stack, tools acpagent.ToolsFactory) *acp.ClientSideConnection {
	t.Helper()
	return serveTo(t, s, tools, &editor{})
}

// serveTo is serve with the editor ed on the client side.
func serveTo(t *testing.T, s *stack.Stack, tools acpagent.ToolsFactory, ed acp.Client) *acp.ClientSideConnection {
	t.Helper()
	conn, _ := serveStoppable(t, s, tools, ed)
	return conn
}

// serveStoppable is serveTo, and stop disconnects the editor (the server
// stops as at EOF) before the test ends; it may be called more than once.
func serveStoppable(t *testing.T, s *stack.Stack, tools acpagent.ToolsFactory, ed acp.Client) (_ *acp.ClientSideConnection, stop func()) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	svc, err := acpagent.New(acpagent.Config{
		Client: s.Client, Store: s.Store, In: inR, Out: outW, Logger: testutil.Logger(t), Tools: tools,
		Models: func() (model.Model, error) { return model.NewScripted(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- svc.Run(context.Background()) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = inW.Close()
			select {
			case err := <-stopped:
				if err != nil {
					t.Errorf("the agent server: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Error("the agent server did not stop at EOF")
			}
			_ = outW.Close()
			_ = inR.Close()
		})
	}
	t.Cleanup(stop)
	conn := acp.NewClientSideConnection(ed, inW, outR)
	conn.SetLogger(testutil.Logger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := conn.Initialize(ctx, acp.InitializeRequest{ProtocolVersion: acp.ProtocolVersionNumber}); err != nil {
		t.Fatal(err)
	}
	return conn, stop
}
