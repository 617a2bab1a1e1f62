package main

import (
	"bytes"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	a2agateway "github.com/brood-dev/brood/services/a2a-gateway"
)

// syncBuffer is a bytes.Buffer safe for a command writing while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serve runs a long-lived verb (a service, brood dev, brood ui) in-process
// until it printed ready (on stdout or stderr), then stops it as Ctrl-C
// does (SIGINT; the test process itself ignores it meanwhile) and returns
// what it printed and its exit status.
func (c *cli) serve(t *testing.T, ready string, args ...string) outcome {
	t.Helper()
	return c.serveDuring(t, ready, nil, args...)
}

// serveDuring is serve that runs during (when not nil) once the verb
// printed ready, before stopping it.
func (c *cli) serveDuring(t *testing.T, ready string, during func(), args ...string) outcome {
	t.Helper()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt) // the test process survives its own SIGINT
	defer signal.Stop(sig)
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() { done <- execute(args, &out, &errb) }()
	printed := func() string { return out.String() + errb.String() }
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(printed(), ready); time.Sleep(20 * time.Millisecond) {
		select {
		case code := <-done:
			return outcome{out: out.String(), err: errb.String(), code: code}
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("brood %s printed no %q in 60 s:\n%s", strings.Join(args, " "), ready, printed())
		}
	}
	if during != nil {
		during()
	}
	// Until the verb's own signal handler is in place, a signal only
	// reaches the test's: send it again until the verb returns.
	for deadline := time.Now().Add(60 * time.Second); ; {
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		select {
		case code := <-done:
			return outcome{out: out.String(), err: errb.String(), code: code}
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("brood %s still runs 60 s after Ctrl-C:\n%s", strings.Join(args, " "), printed())
		}
	}
}

// withStdio runs f with os.Stdin reading in and os.Stdout written to the
// returned string (acp-agent speaks ACP on the process's stdin and stdout);
// stdin closes once stdout holds until, or after 30 s.
func withStdio(t *testing.T, in, until string, f func()) string {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var got syncBuffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := outR.Read(buf)
			_, _ = got.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	go func() {
		_, _ = inW.WriteString(in)
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(got.String(), until) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		inW.Close()
	}()
	oldIn, oldOut := os.Stdin, os.Stdout
	os.Stdin, os.Stdout = inR, outW
	defer func() { os.Stdin, os.Stdout = oldIn, oldOut }()
	f()
	outW.Close()
	<-read
	inR.Close()
	return got.String()
}

// helpVerbs are the verbs `brood --help` lists under its groups.
func helpVerbs(t *testing.T, help string) []string {
	t.Helper()
	var verbs []string
	_, groups, _ := strings.Cut(help, "Run everything in one process:")
	groups, _, _ = strings.Cut(groups, "Additional Commands:")
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z][a-z0-9-]*) `).FindAllStringSubmatch(groups, -1) {
		verbs = append(verbs, m[1])
	}
	if len(verbs) < 20 {
		t.Fatalf("brood --help lists %d verbs:\n%s", len(verbs), help)
	}
	return verbs
}

// TestEveryVerbAnswersWithItsShapeAndExitCode: each verb `brood --help`
// lists, on an embedded deployment, once succeeding (exit 0 and what it
// prints, a long-lived verb stopped by Ctrl-C) and once failing (exit 1, a
// stable code first on stderr: docs/design.md §9, pkg/protocol's catalogue). A
// verb added to the help without a row here fails the test.
func TestEveryVerbAnswersWithItsShapeAndExitCode(t *testing.T) {
	c := newCLI(t)
	const id = `[0-9A-Z]{26}`
	busy := c.startChild("sleep 120s\nsay late")
	idle := c.startChild("say quick")
	other := c.startChild("sleep 120s\nsay late")
	c.eventually("the busy children run and the quick one is done", func() bool {
		return c.ok("state", busy).out == "running\n" && c.ok("state", other).out == "running\n" && c.ok("state", idle).out == "none\n"
	})
	root := c.stack.Root()
	agentBin, err := filepath.Abs("../../.deps/bin/agent") // make acp-deps
	if err != nil {
		t.Fatal(err)
	}
	unreachable := "nats://127.0.0.1:1"
	type row struct {
		ok      func() outcome // a success
		out     string         // regexp its stdout matches
		errOut  string         // regexp its stderr matches ("" : anything)
		fail    []string       // a failure's args (with --nats of the deployment unless they name one)
		code    string         // the failure's code
		failRaw bool           // fail runs without --nats appended
	}
	rows := map[string]row{
		"dev": {
			ok: func() outcome {
				return c.serve(t, "Ctrl-C drains and exits", "dev", "--data", t.TempDir(), "--listen", "127.0.0.1:0")
			},
			out:  `(?s)^brood dev: NATS client URL nats://127\.0\.0\.1:\d+\n.*Ctrl-C drains and exits\nbrood dev: drained and stopped\n$`,
			fail: []string{"dev", "--listen", "no-port"}, code: "INVALID_ARGUMENT", failRaw: true,
		},
		"providers": {
			ok:   func() outcome { return c.run("providers") },
			out:  `(?m)^PROVIDER +INSTANCES .*\n(.*\n)*spawn +1 +`,
			fail: []string{"providers", "--nats", unreachable}, code: "UNAVAILABLE", failRaw: true,
		},
		"run": {
			ok:  func() outcome { return c.run("run", "--provider", "spawn", "say hello") },
			out: `^hello\n$`, errOut: `^child ` + id + `\n` + usageRE + `$`,
			fail: []string{"run", "--provider", "nope", "say x"}, code: "NO_PROVIDER",
		},
		"start": {
			ok:   func() outcome { return c.run("start", "--provider", "spawn", "say one") },
			out:  `^childId ` + id + `\nmessageId ` + id + `\nparentSession ` + id + `\n$`,
			fail: []string{"start", "--provider", "spawn", "--persona", "{{nope}}", "x"}, code: "INVALID_PERSONA",
		},
		"followup": {
			ok:   func() outcome { return c.run("followup", idle, "say again") },
			out:  `^messageId ` + id + `\n$`,
			fail: []string{"followup", "01NOSUCHCHILD0000000000000", "say x"}, code: "NOT_RESUMABLE",
		},
		"state": {
			ok:   func() outcome { return c.run("state", busy) },
			out:  `^running\n$`,
			fail: []string{"state", "01NOSUCHCHILD0000000000000"}, code: "NOT_FOUND",
		},
		"result": {
			ok:  func() outcome { return c.run("result", "--wait", idle) },
			out: `^again\n$`, errOut: `^` + idle + `: turn 2 completed \(state none\)\n` + usageRE + `$`,
			fail: []string{"result", "01NOSUCHCHILD0000000000000"}, code: "NOT_FOUND",
		},
		"children": {
			ok:   func() outcome { return c.run("children") },
			out:  `^CHILD +KIND +MODE +STATE +PROVIDER +LABEL +PARENT +DEPTH +TOKENS +REQUESTS\n(.*\n)*` + busy + ` +child +continuable +running +spawn +`,
			fail: []string{"children", "a", "b"}, code: "INVALID_ARGUMENT",
		},
		"log": {
			ok:   func() outcome { return c.run("log", idle) },
			out:  `(?s)session ` + idle + `.*turn 1 completed`,
			fail: []string{"log", "01NOSUCHCHILD0000000000000"}, code: "NOT_FOUND",
		},
		"watch": {
			ok: func() outcome {
				done := make(chan outcome, 1)
				go func() { done <- c.run("watch", "--count", "1") }()
				for {
					c.ok("run", "--provider", "spawn", "say ok")
					select {
					case o := <-done:
						return o
					case <-time.After(200 * time.Millisecond):
					}
				}
			},
			out: `^\d\d:\d\d:\d\d\.\d{3} subagent/(start|end) ` + id + ` \(spawn, run ` + id + `\)( → completed: ok)? \[parent ` + id + `\]\n$`, errOut: `^watching every parent \(Ctrl-C stops\)\n$`,
			fail: []string{"watch", "--count", "-1"}, code: "INVALID_ARGUMENT",
		},
		"inbox": {
			ok:   func() outcome { return c.run("inbox", root.SessionID) },
			out:  `^SEQ +MESSAGE +KIND +FROM +DELIVERY +TEXT\n\(inbox empty\)\n$`,
			fail: []string{"inbox", "NOSUCHSESSION"}, code: "NOT_FOUND",
		},
		"ui": {
			ok:   func() outcome { return c.serve(t, "Ctrl-C stops", "ui", "--listen", "127.0.0.1:0", "--nats", c.url) },
			out:  `^brood ui: http://127\.0\.0\.1:\d+/ \(Ctrl-C stops\)\n$`,
			fail: []string{"ui", "--listen", "0.0.0.0:0"}, code: "INVALID_ARGUMENT",
		},
		"interrupt": {
			ok:   func() outcome { return c.run("interrupt", busy) },
			out:  `^interrupted ` + busy + `: its turn stops; queued messages wait for the next followup\n$`,
			fail: []string{"interrupt", "01NOSUCHCHILD0000000000000"}, code: "NOT_FOUND",
		},
		"dispose": {
			ok:   func() outcome { return c.run("dispose", other) },
			out:  `^disposed 1 activation, child first:\n` + other + `\n$`,
			fail: []string{"dispose", "01NOSUCHCHILD0000000000000"}, code: "NOT_FOUND",
		},
		"drain": {
			ok: func() outcome {
				o := c.run("drain")
				c.ok("drain", "--lift")
				return o
			},
			out:  `^drained \d+ activations?; admission stays closed until ` + "`brood drain --lift`" + `\n`,
			fail: []string{"drain", "--list", "--lift"}, code: "INVALID_ARGUMENT",
		},
		"requests": {
			ok:   func() outcome { return c.run("requests") },
			out:  `^REQUEST +SESSION +STATE +HANDLER +TOOL +ARGUMENTS +DEADLINE\n\(no requests\)\n$`,
			fail: []string{"requests", "a", "b"}, code: "INVALID_ARGUMENT",
		},
		"approve": {
			ok:   func() outcome { return c.run("approve", c.parkedRequest()) },
			out:  `^r[0-9a-f]{24} approved: run_command of \{"command":"true"\} in ` + id + `\n$`,
			fail: []string{"approve", "rnosuchrequest"}, code: "NOT_FOUND",
		},
		"deny": {
			ok:   func() outcome { return c.run("deny", "--reason", "no", c.parkedRequest()) },
			out:  `^r[0-9a-f]{24} denied: run_command of \{"command":"true"\} in ` + id + `\n$`,
			fail: []string{"deny", "--reason", "no", "rnosuchrequest"}, code: "NOT_FOUND",
		},
		"answer": {
			ok:   func() outcome { return c.run("answer", c.parkedQuestion(), "yes") },
			out:  `^r[0-9a-f]{24} answered in ` + id + `: yes\n$`,
			fail: []string{"answer", "rnosuchrequest", "yes"}, code: "NOT_FOUND",
		},
		"budget": {
			ok:   func() outcome { return c.run("budget", c.startChild("--budget", "toolCalls=5", "say quick")) },
			out:  `^BUDGET +LIMIT +VALUE +USED +RESERVED +LEFT\n` + id + ` +toolCalls +5 +0 +0 +5\n$`,
			fail: []string{"budget", "01NOSUCHCHILD0000000000000"}, code: "NOT_FOUND",
		},
		"grant": {
			ok:   func() outcome { return c.run("grant") },
			out:  `^grant \S{20,}\nexpiresAt \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\nscope .+\n$`,
			fail: []string{"grant", "--nats", unreachable}, code: "UNAVAILABLE", failRaw: true,
		},
		"provision": {
			ok:   func() outcome { return c.run("provision") },
			out:  `^provisioned Brood's streams and buckets with 1 replicas for providers spawn,fork,acp\n$`,
			fail: []string{"provision", "--replicas", "0"}, code: "INVALID_ARGUMENT",
		},
		"coordinator": {
			ok:     func() outcome { return c.serve(t, "coordinator serving", "coordinator", "--nats", c.url) },
			errOut: `(?s)msg="coordinator serving".*msg="coordinator stopped"`,
			fail:   []string{"coordinator", "--nats", unreachable}, code: "UNAVAILABLE", failRaw: true,
		},
		"collector": {
			ok:     func() outcome { return c.serve(t, "collector serving", "collector", "--nats", c.url) },
			errOut: `(?s)msg="collector serving".*msg="collector stopped"`,
			fail:   []string{"collector", "--retention", "0"}, code: "INVALID_ARGUMENT",
		},
		"spawn-worker": {
			ok: func() outcome {
				return c.serve(t, `providers=[spawn]`, "spawn-worker", "--nats", c.url, "--model", "scripted")
			},
			errOut: `(?s)msg="host serving" host=spawn\.` + id + ` providers=\[spawn\].*msg="host drained"`,
			fail:   []string{"spawn-worker", "--model", "bogus"}, code: "INVALID_ARGUMENT",
		},
		"fork-worker": {
			ok: func() outcome {
				return c.serve(t, `providers=[fork]`, "fork-worker", "--nats", c.url, "--model", "scripted")
			},
			errOut: `(?s)msg="host serving" host=fork\.` + id + ` providers=\[fork\].*msg="host drained"`,
			fail:   []string{"fork-worker", "--model", "bogus"}, code: "INVALID_ARGUMENT",
		},
		"acp-bridge": {
			ok: func() outcome {
				// acp: a provider whose streams are provisioned (store.DefaultProviders).
				return c.serve(t, `providers=[acp]`, "acp-bridge", "--nats", c.url, "--agent", "name=acp,command="+agentBin)
			},
			errOut: `(?s)msg="host serving" host=acp\.` + id + ` providers=\[acp\].*msg="host drained"`,
			fail:   []string{"acp-bridge"}, code: "INVALID_ARGUMENT",
		},
		"a2a-gateway": {
			ok: func() outcome {
				callers := filepath.Join(t.TempDir(), "callers.json")
				body := `{"callers":[{"user":"alice","tokenSha256":"` + a2agateway.TokenHash("t") + `"}]}`
				if err := os.WriteFile(callers, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
				return c.serve(t, "a2a gateway serving", "a2a-gateway", "--nats", c.url, "--listen", "127.0.0.1:0", "--callers", callers)
			},
			errOut: `(?s)msg="a2a gateway serving" addr=127\.0\.0\.1:\d+.*msg="a2a gateway stopped"`,
			fail:   []string{"a2a-gateway", "--callers", "/nonexistent/callers.json"}, code: "INVALID_ARGUMENT",
		},
		"a2a-worker": {
			ok: func() outcome {
				c.ok("provision", "--providers", "spawn,fork,acp,a2a-echo")
				return c.serve(t, `providers=[a2a-echo]`, "a2a-worker", "--nats", c.url, "--name", "a2a-echo", "--card", "http://127.0.0.1:1/.well-known/agent-card.json")
			},
			errOut: `(?s)msg="host serving" host=a2a-echo\.` + id + ` providers=\[a2a-echo\].*msg="host drained"`,
			fail:   []string{"a2a-worker", "--name", "a2a-echo"}, code: "INVALID_ARGUMENT",
		},
		"acp-agent": {
			ok: func() outcome {
				var o outcome
				o.out = withStdio(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`+"\n", `"id":1`, func() {
					o2 := c.run("acp-agent")
					o.err, o.code = o2.err, o2.code
				})
				return o
			},
			out:  `^\{"jsonrpc":"2.0","id":1,"result":\{.*"agentInfo":\{"name":"brood".*"protocolVersion":1\}\}\n$`,
			fail: []string{"acp-agent", "--model", "bogus"}, code: "INVALID_ARGUMENT",
		},
		"mcp": {
			ok: func() outcome {
				var o outcome
				o.out = withStdio(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`+"\n", `"id":1`, func() {
					o2 := c.run("mcp", "--cwd", t.TempDir())
					o.err, o.code = o2.err, o2.code
				})
				return o
			},
			out:  `^\{"jsonrpc":"2.0","id":1,"result":\{.*"serverInfo":\{"name":"brood".*\}\}\n$`,
			fail: []string{"mcp", "--listen", "256.0.0.1:bogus"}, code: "INVALID_ARGUMENT",
		},
	}
	verbs := helpVerbs(t, c.runBare("--help").out)
	for _, v := range verbs {
		r, ok := rows[v]
		if !ok {
			t.Errorf("brood --help lists %s, which has no row here", v)
			continue
		}
		delete(rows, v)
		t.Run(v, func(t *testing.T) {
			o := r.ok()
			if o.code != 0 {
				t.Fatalf("exit %d\nstdout: %s\nstderr: %s", o.code, o.out, o.err)
			}
			if r.out != "" && !regexp.MustCompile(r.out).MatchString(o.out) {
				t.Errorf("stdout %q does not match %s", o.out, r.out)
			}
			if r.errOut != "" && !regexp.MustCompile(r.errOut).MatchString(o.err) {
				t.Errorf("stderr %q does not match %s", o.err, r.errOut)
			}
			var f outcome
			if r.failRaw {
				f = c.runBare(r.fail...)
			} else {
				f = c.run(r.fail...)
			}
			if f.code != 1 || !strings.HasPrefix(f.err, r.code+": ") {
				t.Errorf("brood %s: exit %d, stderr %q; want exit 1 and %s first", strings.Join(r.fail, " "), f.code, f.err, r.code)
			}
		})
	}
	for v := range rows {
		t.Errorf("row %s names no verb of brood --help", v)
	}
}

// usageRE is the usage line `brood run` and `brood result` print on stderr
// after a result (docs/protocol.md §6.6).
const usageRE = `usage: own \d+ in \+ \d+ out tokens, \d+ model requests?, \d+ tool calls?, [\d.]+m?s; subtree \d+ in \+ \d+ out tokens, \d+ model requests?, \d+ tool calls?, [\d.]+m?s\n`
