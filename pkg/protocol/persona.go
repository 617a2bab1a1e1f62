package protocol

import (
	"fmt"
	"regexp"
	"strings"
)

// This file holds persona templates (docs/upstream-behaviour.md §1.8): the
// coordinator validates a start's persona with ValidatePersona when it admits
// the start, and an agent renders its persona with RenderTemplate.

// Template variables the runtime registers (docs/upstream-behaviour.md §1.8).
var TemplateVars = []string{"provider", "model", "cwd"}

var templateNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// RenderTemplate interpolates `{{name}}` references strictly
// (docs/upstream-behaviour.md §1.8): a name must match ^[a-z][a-z0-9_]*$ and be one
// of vars; a malformed group (`{{}}`, `{{a b}}`) or an unknown or unset name
// is an INVALID_PERSONA error; a lone `{{` with no later `}}` is literal
// text; substituted values are not re-scanned.
func RenderTemplate(tmpl string, vars map[string]string) (string, error) {
	var b strings.Builder
	rest := tmpl
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		j := strings.Index(rest[i+2:], "}}")
		if j < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		name := rest[i+2 : i+2+j]
		if !templateNameRE.MatchString(name) {
			return "", NewError(CodeInvalidPersona, map[string]any{
				"reason": fmt.Sprintf("malformed reference {{%s}}: a name must match ^[a-z][a-z0-9_]*$", name)})
		}
		v, ok := vars[name]
		if !ok {
			return "", NewError(CodeInvalidPersona, map[string]any{
				"reason": fmt.Sprintf("unknown variable {{%s}}; known: {{provider}}, {{model}}, {{cwd}}", name)})
		}
		b.WriteString(rest[:i])
		b.WriteString(v)
		rest = rest[i+2+j+2:]
	}
}

// ValidatePersona checks a persona template with placeholder values for every
// registered variable, so a bad template fails at start (Brood's deliberate
// improvement over upstream, docs/design.md §10).
func ValidatePersona(p string) error {
	vars := map[string]string{}
	for _, v := range TemplateVars {
		vars[v] = v
	}
	_, err := RenderTemplate(p, vars)
	return err
}
