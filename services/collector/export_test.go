package collector

// OnHeadersRemoved runs f after a collection removed a tree's headers and
// before it reads the tree again.
func OnHeadersRemoved(c *Collector, f func(root string)) { c.headersRemoved = f }
