package testutil

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KVEntry is a KV entry as a bucket's watch delivers it (a
// jetstream.KeyValueEntry), for tests that feed a watch's consumer by hand:
// Name is the key, Data the value, Rev the revision and Op the operation
// (the zero value is a put). Its bucket is "test"; it has no creation time
// and no delta.
type KVEntry struct {
	Name string
	Data []byte
	Rev  uint64
	Op   jetstream.KeyValueOp
}

func (e KVEntry) Bucket() string                  { return "test" }
func (e KVEntry) Key() string                     { return e.Name }
func (e KVEntry) Value() []byte                   { return e.Data }
func (e KVEntry) Revision() uint64                { return e.Rev }
func (e KVEntry) Created() time.Time              { return time.Time{} }
func (e KVEntry) Delta() uint64                   { return 0 }
func (e KVEntry) Operation() jetstream.KeyValueOp { return e.Op }
