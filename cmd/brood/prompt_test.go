package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runIn runs `brood args... --nats URL` with stdin read from in.
func (c *cli) runIn(in string, args ...string) outcome {
	c.t.Helper()
	var out, errb bytes.Buffer
	code := executeIn(append(args, "--nats", c.url), strings.NewReader(in), &out, &errb)
	return outcome{out: out.String(), err: errb.String(), code: code}
}

// bigPrompt is a prompt of n bytes that is no script directive (the
// scripted model echoes it whole: "echo: " and the text).
func bigPrompt(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "line %06d of a long prompt, é and 😀\n", i)
	}
	return b.String()[:n-1] + "."
}

// TestPromptFromStdinOrFile: run, start and followup take the prompt (the
// message) from stdin ("-") or --prompt-file as well as from the command
// line, so a 200 KiB prompt, past what one argument may hold (Linux
// MAX_ARG_STRLEN, 128 KiB), reaches the child whole; text that is not
// UTF-8 is INVALID_ARGUMENT before anything is sent, and so are a prompt
// given twice or not at all (issue 37, item 4).
func TestPromptFromStdinOrFile(t *testing.T) {
	c := newCLI(t)
	const promptBytes = 200 << 10
	prompt := bigPrompt(promptBytes)
	dir := t.TempDir()
	file := filepath.Join(dir, "prompt.txt")
	if err := os.WriteFile(file, []byte(prompt), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.txt")
	if err := os.WriteFile(bad, []byte("say a\xffb"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("run reads a 200 KiB prompt from stdin", func(t *testing.T) {
		o := c.runIn(prompt, "run", "--provider", "spawn", "-")
		if o.code != 0 || o.out != "echo: "+prompt+"\n" {
			t.Fatalf("exit %d, stdout of %d bytes (want the %d-byte prompt echoed), stderr %q", o.code, len(o.out), len(prompt), o.err)
		}
	})
	t.Run("run reads a 200 KiB prompt from --prompt-file", func(t *testing.T) {
		o := c.run("run", "--provider", "spawn", "--prompt-file", file)
		if o.code != 0 || o.out != "echo: "+prompt+"\n" {
			t.Fatalf("exit %d, stdout of %d bytes (want the %d-byte prompt echoed), stderr %q", o.code, len(o.out), len(prompt), o.err)
		}
	})
	var child string
	t.Run("start reads its prompt from --prompt-file -", func(t *testing.T) {
		o := c.runIn("say from stdin", "start", "--provider", "spawn", "--prompt-file", "-")
		if o.code != 0 {
			t.Fatalf("exit %d, stderr %q", o.code, o.err)
		}
		child = field(t, o.out, "childId")
		c.eventually("the started child answers", func() bool {
			return c.run("result", child).out == "from stdin\n"
		})
	})
	t.Run("followup reads a 200 KiB message from stdin", func(t *testing.T) {
		o := c.runIn(prompt, "followup", child, "-", "--wait", "--progress", "never")
		if o.code != 0 || o.out != "echo: "+prompt+"\n" {
			t.Fatalf("exit %d, stdout of %d bytes (want the %d-byte message echoed), stderr %q", o.code, len(o.out), len(prompt), o.err)
		}
	})

	refused := []struct {
		name string
		in   string
		args []string
	}{
		{"run: a non-UTF-8 argument", "", []string{"run", "--provider", "spawn", "say a\xffb"}},
		{"run: non-UTF-8 stdin", "say a\xffb", []string{"run", "--provider", "spawn", "-"}},
		{"run: a non-UTF-8 --prompt-file", "", []string{"run", "--provider", "spawn", "--prompt-file", bad}},
		{"start: non-UTF-8 stdin", "say \xe2\x82", []string{"start", "--provider", "spawn", "-"}},
		{"followup: a non-UTF-8 message", "", []string{"followup", "01NOSUCHCHILD0000000000000", "say \xff"}},
		{"run: a prompt and --prompt-file", "", []string{"run", "--provider", "spawn", "--prompt-file", file, "say x"}},
		{"run: no prompt", "", []string{"run", "--provider", "spawn"}},
		{"followup: no message", "", []string{"followup", "01NOSUCHCHILD0000000000000"}},
		{"start: a missing --prompt-file", "", []string{"start", "--provider", "spawn", "--prompt-file", filepath.Join(dir, "nope")}},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			// The unknown child is NOT_RESUMABLE once asked: INVALID_ARGUMENT
			// shows the CLI refused before sending.
			o := c.runIn(tt.in, tt.args...)
			if o.code != 1 || !strings.HasPrefix(o.err, "INVALID_ARGUMENT: ") {
				t.Fatalf("exit %d, stderr %q; want exit 1 and INVALID_ARGUMENT first", o.code, o.err)
			}
		})
	}
}
