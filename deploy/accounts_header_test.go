package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestAccountsHeaderNamesEveryPassword: the header of accounts.conf lists
// the environment variables nats-server needs; every password variable the
// file reads is among them (BROOD_NATS_COLLECTOR_PASSWORD was missing: a
// server started from the header's list refused to start; issue 37, item 8).
func TestAccountsHeaderNamesEveryPassword(t *testing.T) {
	data, err := os.ReadFile("nats/cluster/accounts.conf")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "# Passwords come from the environment of nats-server")
	if start < 0 {
		t.Fatal("accounts.conf has no header paragraph on passwords")
	}
	end := strings.Index(text[start:], "# The server parses")
	if end < 0 {
		t.Fatal("the header's password paragraph has no end")
	}
	header := text[start : start+end]
	used := regexp.MustCompile(`password: \$(BROOD_NATS_[A-Z_]+_PASSWORD)`).FindAllStringSubmatch(text, -1)
	if len(used) == 0 {
		t.Fatal("accounts.conf reads no password variable")
	}
	for _, m := range used {
		if !regexp.MustCompile(`\b` + m[1] + `\b`).MatchString(header) {
			t.Errorf("accounts.conf reads $%s but its header does not name it", m[1])
		}
	}
}
