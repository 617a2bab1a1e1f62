package protocol

// KVLatestRequest asks a coordinator for Key of the bucket its subject
// names (Subjects.KVLatest), as the bucket stream's leader has it. The
// reply is KVLatestReply, or an error: INVALID_ARGUMENT (no bucket of
// Brood's, or no key), UNAUTHORIZED (the key is not under the prefixes of
// the provider the subject names: lease.<p>., owns.<p>., spec.<p>.,
// state.<p>.; nothing is read), UNAVAILABLE (retry).
type KVLatestRequest struct {
	Key string `msgpack:"key" json:"key"`
}

// KVLatestReply is the key as the bucket stream's leader has it: Found
// with its Value and Revision (its stream sequence); not Found when it was
// never written (Revision 0) or is deleted or purged (Revision the
// sequence of its delete marker).
type KVLatestReply struct {
	Found    bool   `msgpack:"found" json:"found"`
	Revision uint64 `msgpack:"revision" json:"revision"`
	Value    []byte `msgpack:"value,omitempty" json:"value,omitempty"`
}
