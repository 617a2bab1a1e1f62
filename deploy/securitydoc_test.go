package deploy

import (
	"bufio"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// securityDoc is the threat model whose permissions section must say exactly
// what accounts.conf grants.
const securityDoc = "../docs/security.md"

// docPermissions parses the ```nats-permissions blocks of docs/security.md:
// per user, lines "publish allow|deny SUBJECT", "subscribe allow|deny
// SUBJECT [QUEUE]" and "allow_responses".
func docPermissions(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(securityDoc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	in, user := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "```nats-permissions":
			in, user = true, ""
		case in && line == "```":
			in = false
		case in && strings.HasPrefix(line, "user "):
			user = strings.TrimPrefix(line, "user ")
			if _, dup := out[user]; dup {
				t.Fatalf("%s: user %s has two permission blocks", securityDoc, user)
			}
			out[user] = []string{}
		case in && line != "":
			if user == "" {
				t.Fatalf("%s: permission line %q before its user", securityDoc, line)
			}
			out[user] = append(out[user], strings.Join(strings.Fields(line), " "))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// confPermissions renders a user's permissions as the doc's lines.
func confPermissions(u *server.User) []string {
	var out []string
	add := func(op string, sp *server.SubjectPermission) {
		if sp == nil {
			return
		}
		for _, s := range sp.Allow {
			out = append(out, op+" allow "+strings.Join(strings.Fields(s), " "))
		}
		for _, s := range sp.Deny {
			out = append(out, op+" deny "+strings.Join(strings.Fields(s), " "))
		}
	}
	if p := u.Permissions; p != nil {
		add("publish", p.Publish)
		add("subscribe", p.Subscribe)
		if p.Response != nil {
			out = append(out, "allow_responses")
		}
	}
	return out
}

// TestSecurityDocMatchesTheDeployment: docs/security.md lists exactly the
// permissions of every user of account BROOD in accounts.conf, no more and
// no fewer (issue 17: the threat model matches deploy/).
func TestSecurityDocMatchesTheDeployment(t *testing.T) {
	setPasswords(t)
	doc := docPermissions(t)
	o := processConf(t, clusterDir+"/accounts.conf")
	seen := map[string]bool{}
	for _, u := range o.Users {
		if u.Account == nil || u.Account.Name != "BROOD" {
			continue
		}
		seen[u.Username] = true
		want, ok := doc[u.Username]
		if !ok {
			t.Errorf("%s has no permissions block for user %s", securityDoc, u.Username)
			continue
		}
		got := confPermissions(u)
		sort.Strings(got)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			for _, l := range got {
				if !slices.Contains(want, l) {
					t.Errorf("user %s: accounts.conf grants %q, %s does not say so", u.Username, l, securityDoc)
				}
			}
			for _, l := range want {
				if !slices.Contains(got, l) {
					t.Errorf("user %s: %s says %q, accounts.conf does not grant it", u.Username, securityDoc, l)
				}
			}
		}
	}
	for user := range doc {
		if !seen[user] {
			t.Errorf("%s lists user %s, which accounts.conf does not define", securityDoc, user)
		}
	}
}
