package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestFlagHelpHasNoBackquotes: pflag takes a `quoted` word of a flag's
// usage as the name of its value, so "whatever `brood provision` gave
// them" printed `--replicas brood provision` in the help of every service
// (issue 37, item 8). No flag of any verb quotes a word so.
func TestFlagHelpHasNoBackquotes(t *testing.T) {
	root := newRoot(&globals{out: io.Discard, errOut: io.Discard})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				name, _ := pflag.UnquoteUsage(f)
				t.Errorf("brood %s --%s: its help shows %q as the value's name: %q", c.CommandPath(), f.Name, name, f.Usage)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// TestWorkspaceRootHelpSaysItsDefault: a worker's --workspace-root
// allows no workspace by default and says so; brood dev's allows any (/),
// and its help said "default: none" beside "(default [/])".
func TestWorkspaceRootHelpSaysItsDefault(t *testing.T) {
	root := newRoot(&globals{out: io.Discard, errOut: io.Discard})
	tests := []struct {
		verb, def string
		none      bool // the usage says "default: none"
	}{
		{"dev", "[/]", false},
		{"spawn-worker", "[]", true},
		{"fork-worker", "[]", true},
	}
	for _, tt := range tests {
		t.Run(tt.verb, func(t *testing.T) {
			cmd, _, err := root.Find([]string{tt.verb})
			if err != nil {
				t.Fatal(err)
			}
			f := cmd.Flags().Lookup("workspace-root")
			if f == nil {
				t.Fatalf("brood %s has no --workspace-root", tt.verb)
			}
			if f.DefValue != tt.def || strings.Contains(f.Usage, "default: none") != tt.none {
				t.Fatalf("brood %s --workspace-root: default %q, usage %q; want default %s, \"default: none\" in it %v", tt.verb, f.DefValue, f.Usage, tt.def, tt.none)
			}
		})
	}
}
