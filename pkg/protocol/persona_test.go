package protocol

import "testing"

func TestRenderTemplateIsStrict(t *testing.T) {
	vars := map[string]string{"cwd": "/w", "model": "m", "provider": "p"}
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{"in {{cwd}} with {{model}}", "in /w with m", false},
		{"lone {{ brace", "lone {{ brace", false},
		{"{{nope}}", "", true},
		{"{{}}", "", true},
		{"{{a b}}", "", true},
		{"{{Cwd}}", "", true},
	}
	for _, tt := range tests {
		got, err := RenderTemplate(tt.in, vars)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("RenderTemplate(%q) = %q, %v", tt.in, got, err)
		}
		if err != nil && CodeOf(err) != CodeInvalidPersona {
			t.Errorf("error code = %s", CodeOf(err))
		}
	}
	// Substituted values are not re-scanned.
	got, _ := RenderTemplate("{{cwd}}", map[string]string{"cwd": "{{model}}"})
	if got != "{{model}}" {
		t.Errorf("re-scanned: %q", got)
	}
}
