// Package clientconf holds what the two Redis backends' client constructors
// share.
package clientconf

import "crypto/tls"

// MergeTLS returns the TLS configuration for a connection: the URL's (nil
// for redis://, the server name for rediss://) overridden by the caller's
// o, whose empty ServerName and MinVersion take the URL's name and TLS 1.2.
func MergeTLS(fromURL, o *tls.Config) *tls.Config {
	if fromURL == nil || o == nil {
		return fromURL
	}
	c := o.Clone()
	if c.ServerName == "" {
		c.ServerName = fromURL.ServerName
	}
	if c.MinVersion == 0 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}
