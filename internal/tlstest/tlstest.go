// Package tlstest makes certificate authorities and leaf certificates for
// tests and benchmarks that speak real TLS: ECDSA P-256, valid for a day.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority made for one test. Pool holds its root,
// for clients that verify what a server presents. Safe for concurrent use.
type CA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool
	// PEM is the root certificate in PEM form.
	PEM []byte

	key    *ecdsa.PrivateKey
	serial atomic.Int64
}

// Leaf is a certificate issued by a CA: Chain is the leaf's PEM followed
// by the CA's, KeyPEM the leaf's PKCS#8 private key in PEM form.
type Leaf struct {
	Cert   *x509.Certificate
	Chain  []byte
	KeyPEM []byte
}

// NewCA makes a new CA, valid from an hour ago for a day; it fails tb on
// any error.
func NewCA(tb testing.TB) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("tlstest: CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("tlstest: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("tlstest: CA certificate: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	ca := &CA{Cert: cert, Pool: pool, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}
	ca.serial.Store(1)
	return ca
}

// Issue returns a server certificate for names (DNS names such as
// "a.example.test" or "*.example.test"; the first is also the common name),
// valid from an hour ago for twelve hours.
func (ca *CA) Issue(tb testing.TB, names ...string) Leaf {
	tb.Helper()
	if len(names) == 0 {
		tb.Fatal("tlstest: Issue needs at least one name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("tlstest: leaf key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(12 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("tlstest: leaf certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("tlstest: leaf certificate: %v", err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("tlstest: leaf key: %v", err)
	}
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.PEM...)
	return Leaf{Cert: cert, Chain: chain, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})}
}
