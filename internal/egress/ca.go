package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// CA is the deployment's certificate authority for the secrets' domains:
// the proxy presents certificates it signs to the programs whose requests
// to those domains it decrypts, and the sandbox trusts its certificate
// for the runs that ask for secrets. Its key is derived from the
// deployment's secret (FILE_SECRET, which every executor of the
// deployment shares), so that it is the same key on every executor and
// is never stored anywhere; it lives in the executors' memory only.
// Its certificate is constrained to the secrets' domains (X.509 name
// constraints, critical): a client that checks them, as OpenSSL, Go and
// Node do, trusts nothing else it might sign.
type CA struct {
	cert  *x509.Certificate
	der   []byte
	pem   string
	key   *ecdsa.PrivateKey
	clock clockwork.Clock

	// leafKey is the key of every certificate it issues, made at start.
	leafKey *ecdsa.PrivateKey
	mu      sync.Mutex
	leaves  map[string]*tls.Certificate
}

// Lifetimes of the certificates.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 24 * time.Hour
	// leafRenew is how long before its end a cached certificate is
	// replaced.
	leafRenew = 12 * time.Hour
	// backdate covers clocks a little behind the executor's.
	backdate = time.Hour
	// maxLeaves bounds the certificates kept; a wildcard domain names
	// any number of hosts.
	maxLeaves = 256
)

// caInfo is the HKDF context of the CA's key: a new version is a new key.
const caInfo = "runbox egress secrets CA v1"

// NewCA derives the CA from secret, constrained to domains (every
// secret's).
func NewCA(secret []byte, domains Patterns, clock clockwork.Clock) (*CA, error) {
	if len(secret) == 0 {
		return nil, errors.New("egress CA: no deployment secret to derive it from")
	}
	if len(domains) == 0 {
		return nil, errors.New("egress CA: no domain to constrain it to")
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	var key *ecdsa.PrivateKey
	for i := 0; key == nil; i++ {
		// A scalar at or past the curve's order (odds of 2^-32) is
		// refused: the next counter gives another.
		raw, err := hkdf.Key(sha256.New, secret, nil, fmt.Sprintf("%s #%d", caInfo, i), 32)
		if err != nil {
			return nil, err
		}
		key, _ = ecdsa.ParseRawPrivateKey(elliptic.P256(), raw)
	}
	pub, err := key.PublicKey.Bytes()
	if err != nil {
		return nil, err
	}
	id := sha256.Sum256(pub)
	permitted := make([]string, 0, len(domains))
	for _, d := range domains {
		if d.wildcard {
			permitted = append(permitted, "."+d.name) // below it, not itself
		} else {
			permitted = append(permitted, d.name)
		}
	}
	now := clock.Now()
	tmpl := &x509.Certificate{
		SerialNumber: new(big.Int).SetBytes(id[:16]),
		Subject: pkix.Name{Organization: []string{"runbox"},
			CommonName: "runbox egress secrets CA " + hex.EncodeToString(id[:4])},
		NotBefore:                   now.Add(-backdate),
		NotAfter:                    now.Add(caLifetime),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
		SubjectKeyId:                id[:20],
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, der: der, key: key, clock: clock, leafKey: leafKey, leaves: map[string]*tls.Certificate{},
		pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}, nil
}

// PEM returns the CA's certificate (never its key), as the sandbox trusts
// it.
func (ca *CA) PEM() string { return ca.pem }

// Certificate returns the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// leaf returns a certificate for host, made on first use and kept until
// it nears its end.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	now := ca.clock.Now()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[host]; c != nil && c.Leaf.NotAfter.Sub(now) > leafRenew {
		return c, nil
	}
	end := now.Add(leafLifetime)
	if end.After(ca.cert.NotAfter) {
		end = ca.cert.NotAfter
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial,
		Subject:        pkix.Name{CommonName: host},
		DNSNames:       []string{host},
		NotBefore:      now.Add(-backdate),
		NotAfter:       end,
		KeyUsage:       x509.KeyUsageDigitalSignature,
		ExtKeyUsage:    []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		AuthorityKeyId: ca.cert.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: a certificate for %s: %w", host, err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if len(ca.leaves) >= maxLeaves {
		// Made again on their next use: a few signatures.
		clear(ca.leaves)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.der}, PrivateKey: ca.leafKey, Leaf: parsed}
	ca.leaves[host] = c
	return c, nil
}
