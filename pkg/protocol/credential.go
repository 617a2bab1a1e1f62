package protocol

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
)

// NewCredential returns a fresh unguessable token (256 random bits,
// base64url): an agent's credential or a user grant.
func NewCredential() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// HashCredential is the hex SHA-256 of a credential; records store the hash,
// never the credential.
func HashCredential(c string) string {
	sum := sha256.Sum256([]byte(c))
	return hex.EncodeToString(sum[:])
}

// CredentialMatches compares a presented credential with a stored hash in
// constant time.
func CredentialMatches(presented, hash string) bool {
	if presented == "" || hash == "" {
		return false
	}
	h := HashCredential(presented)
	return subtle.ConstantTimeCompare([]byte(h), []byte(hash)) == 1
}
