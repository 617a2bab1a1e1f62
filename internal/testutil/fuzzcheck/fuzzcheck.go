// Package fuzzcheck holds what Brood's fuzz targets share beyond "no panic":
// the bound on what a parser may allocate for an input of a given size, and
// the seed corpus check that every target's testdata really runs.
package fuzzcheck

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Allocated returns the heap bytes allocated while f ran
// (runtime.MemStats.TotalAlloc). Every goroutine of the process counts, so
// the figure is an upper bound on f's own allocation.
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// attempts is how often AllocWithin measures a run that went over its
// bound before it judges: other goroutines of the test binary allocate now
// and then, the code under test allocates the same every time, so the
// least of a few runs is its own figure.
const attempts = 3

// AllocWithin fails t when f allocates more than max bytes in each of a few
// runs (f must do the same work every time it is called: build what it
// decodes into inside f). what names the work in the failure.
func AllocWithin(t testing.TB, what string, max uint64, f func()) {
	t.Helper()
	least := ^uint64(0)
	for range attempts {
		least = min(least, Allocated(f))
		if least <= max {
			return
		}
	}
	t.Fatalf("%s allocated %d bytes, over its bound of %d", what, least, max)
}

// NoAlloc fails t when f allocates on the heap in each of a few runs.
func NoAlloc(t testing.TB, what string, f func()) {
	t.Helper()
	least := ^uint64(0)
	for range attempts {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		if least = min(least, after.Mallocs-before.Mallocs); least == 0 {
			return
		}
	}
	t.Fatalf("%s allocated %d times, want none", what, least)
}

// Bound is an allocation bound linear in the input: base bytes plus
// perByte for each input byte.
type Bound struct{ Base, PerByte uint64 }

// Of returns the bound for an input of n bytes.
func (b Bound) Of(n int) uint64 { return b.Base + b.PerByte*uint64(n) }

func (b Bound) String() string {
	return fmt.Sprintf("%d bytes + %d per input byte", b.Base, b.PerByte)
}

// SeedsPresent fails f unless testdata/fuzz/<name> holds at least min seed
// files, so a renamed target or a lost directory cannot leave `go test`
// running a target on its f.Add seeds alone.
func SeedsPresent(f *testing.F, name string, min int) {
	f.Helper()
	entries, err := os.ReadDir(filepath.Join("testdata", "fuzz", name))
	if err != nil {
		f.Fatalf("seed corpus of %s: %v", name, err)
	}
	if len(entries) < min {
		f.Fatalf("seed corpus of %s holds %d files, want at least %d", name, len(entries), min)
	}
}
