// Package httpauth holds the rules every HTTP door of Brood applies to who
// may call it (the web view, `brood mcp --listen`): without an access token
// a door listens on loopback only and answers only requests whose Host is a
// loopback name, so a page elsewhere cannot rebind a name to it; beyond
// loopback it needs an access token, sent as `Authorization: Bearer TOKEN`
// and compared in constant time (docs/security.md, "HTTP doors").
package httpauth

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
)

// IsLoopback reports whether host (a name or an address, IPv6 in brackets
// or not) is loopback: "localhost" or an address of 127.0.0.0/8 or ::1.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// HostIsLoopback reports whether a request's Host (with or without a port)
// is a loopback name.
func HostIsLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	return IsLoopback(host)
}

// Bearer is the token of a request's `Authorization: Bearer TOKEN` header,
// or "" when it has none.
func Bearer(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if len(a) > len("Bearer ") && strings.EqualFold(a[:len("Bearer ")], "Bearer ") {
		return a[len("Bearer "):]
	}
	return ""
}

// TokenOK reports whether tok is the access token want: never for an empty
// token, and in time independent of where they differ.
func TokenOK(tok, want string) bool {
	return tok != "" && want != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(want)) == 1
}
