package sessionlog

import (
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestSettledNoticeSaysWhenTheOutputIsEarlier: a settlement notice whose
// output is not the child's last message says so (issue 14, item 9).
func TestSettledNoticeSaysWhenTheOutputIsEarlier(t *testing.T) {
	res := protocol.SubagentResult{StopReason: protocol.StopCompleted, Output: protocol.Text("Let me look first."),
		OutputFrom: &protocol.OutputSource{Seq: 3, Turn: 1, Step: 1, Last: false}}
	_, content := SettledNotice("C", res)
	if text := protocol.PlainText(content); !strings.Contains(text, "Closing message:\nLet me look first.\n") ||
		!strings.Contains(text, "turn 1, step 1; its last message was empty") {
		t.Fatalf("notice %q", text)
	}
	res.OutputFrom.Last = true
	if _, content := SettledNotice("C", res); strings.Contains(protocol.PlainText(content), "last message was empty") {
		t.Fatalf("notice %q", protocol.PlainText(content))
	}
}
