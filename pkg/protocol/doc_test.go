package protocol_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestProtocolDocCatalogue keeps the error table of docs/protocol.md §2.2
// equal to Catalogue: every code with its number, retry mark, message template and hint,
// and no row the code does not have. Clients in other languages are written
// from that table (clients/typescript checks its own catalogue against it).
func TestProtocolDocCatalogue(t *testing.T) {
	data, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	start, end := strings.Index(doc, "### 2.2 Catalogue"), strings.Index(doc, "### 2.3")
	if start < 0 || end < start {
		t.Fatal("docs/protocol.md has no §2.2 Catalogue followed by §2.3")
	}
	type row struct {
		number         int
		retryable      bool
		template, hint string
	}
	rows := map[protocol.Code]row{}
	var order []protocol.Code
	for _, line := range strings.Split(doc[start:end], "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 7 {
			t.Fatalf("a catalogue row has %d cells, want 7: %s", len(cells), line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		code := protocol.Code(strings.Trim(cells[0], "`"))
		n, err := strconv.Atoi(cells[1])
		if err != nil {
			t.Fatalf("row %s: number %q: %v", code, cells[1], err)
		}
		if _, dup := rows[code]; dup {
			t.Errorf("code %s has two rows", code)
		}
		if cells[2] != "yes" && cells[2] != "no" {
			t.Fatalf("row %s: retry %q, want yes or no", code, cells[2])
		}
		rows[code] = row{number: n, retryable: cells[2] == "yes", template: strings.TrimSuffix(strings.TrimPrefix(cells[3], "`"), "`"), hint: cells[4]}
		order = append(order, code)
	}
	for i, e := range protocol.Catalogue {
		r, ok := rows[e.Code]
		if !ok {
			t.Errorf("docs/protocol.md §2.2 lacks %s", e.Code)
			continue
		}
		if r.number != e.Number || r.retryable != e.Retryable || r.template != e.Template || r.hint != e.Hint {
			t.Errorf("%s in the document: %d retry %v %q %q\nin the code:              %d retry %v %q %q",
				e.Code, r.number, r.retryable, r.template, r.hint, e.Number, e.Retryable, e.Template, e.Hint)
		}
		if i < len(order) && order[i] != e.Code {
			t.Errorf("row %d is %s, the catalogue's entry %d is %s (keep the order)", i+1, order[i], i+1, e.Code)
		}
		delete(rows, e.Code)
	}
	for code := range rows {
		t.Errorf("docs/protocol.md §2.2 lists %s, which the catalogue does not have", code)
	}
}
