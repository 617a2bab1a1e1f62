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
