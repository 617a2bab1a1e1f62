package a2agateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Caller is one A2A caller the gateway admits: a bearer token (kept only as
// its SHA-256) mapped to the Brood user it acts as (docs/security.md, "The
// A2A gateway").
type Caller struct {
	// User is the Brood (NATS) user the caller acts as: the gateway calls the
	// coordinator on that user's subjects, over a connection of that user,
	// so a caller reaches only the trees of the roots that user opened.
	// ^[A-Za-z0-9_-]{1,64}$.
	User string `json:"user"`
	// TokenSHA256 is the lower-case hex SHA-256 of the caller's bearer token
	// (64 hex digits). The token itself is never stored by the gateway.
	TokenSHA256 string `json:"tokenSha256"`
	// NATSPassword is User's NATS password in a deployment with NATS users
	// (deploy/nats/cluster/accounts.conf); empty where NATS has no users
	// (brood dev). It is a secret: the file holding it is the gateway's alone.
	NATSPassword string `json:"natsPassword,omitempty"`
}

// tokensFile is the JSON shape of the callers file (--callers FILE):
// {"callers": [{"user", "tokenSha256", "natsPassword"?}, ...]}.
type tokensFile struct {
	Callers []Caller `json:"callers"`
}

// callersFileBytesMax bounds the callers file.
const callersFileBytesMax = 1 << 20

// LoadCallers reads a callers file (JSON, tokensFile's shape). Every entry is
// checked (CheckCallers).
func LoadCallers(path string) ([]Caller, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "callers file: %v", err)
	}
	if st.Size() > callersFileBytesMax {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "callers file %s is %d bytes, over %d", path, st.Size(), callersFileBytesMax)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "callers file: %v", err)
	}
	var f tokensFile
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "callers file %s: %v", path, err)
	}
	if err := CheckCallers(f.Callers); err != nil {
		return nil, err
	}
	return f.Callers, nil
}

// CheckCallers refuses an empty list, a user that is no subject token, a
// token hash that is not 64 lower-case hex digits, and a token hash given
// twice.
func CheckCallers(cs []Caller) error {
	if len(cs) == 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "no callers: the gateway admits no one (give at least one {user, tokenSha256})")
	}
	seen := map[string]bool{}
	for i, c := range cs {
		if !protocol.ValidID(c.User) {
			return protocol.Errorf(protocol.CodeInvalidArgument, "caller %d: user %q must match ^[A-Za-z0-9_-]{1,64}$", i, c.User)
		}
		b, err := hex.DecodeString(c.TokenSHA256)
		if err != nil || len(b) != sha256.Size || strings.ToLower(c.TokenSHA256) != c.TokenSHA256 {
			return protocol.Errorf(protocol.CodeInvalidArgument, "caller %d (%s): tokenSha256 must be 64 lower-case hex digits (sha256sum of the token)", i, c.User)
		}
		if seen[c.TokenSHA256] {
			return protocol.Errorf(protocol.CodeInvalidArgument, "caller %d (%s): the same token is given twice", i, c.User)
		}
		seen[c.TokenSHA256] = true
	}
	return nil
}

// TokenHash is the hex SHA-256 of a bearer token, as a callers file holds it.
func TokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// authenticate finds the caller of a request from its Authorization header
// (`Bearer <token>`). Every configured hash is compared in constant time,
// so the time taken says nothing about which hashes exist.
func authenticate(callers []Caller, r *http.Request) (Caller, error) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return Caller{}, fmt.Errorf("an Authorization: Bearer <token> header is required")
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	var found Caller
	matched := 0
	for _, c := range callers {
		want, _ := hex.DecodeString(c.TokenSHA256)
		if subtle.ConstantTimeCompare(want, sum[:]) == 1 {
			found = c
			matched++
		}
	}
	if matched != 1 {
		return Caller{}, fmt.Errorf("unknown bearer token")
	}
	return found, nil
}
