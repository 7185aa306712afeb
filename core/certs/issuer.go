package certs

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sync"

	"github.com/caddyserver/certmagic"
	"github.com/mholt/acmez/v3"
	"github.com/mholt/acmez/v3/acme"
)

// ErrNoACME is the failure of a tls_mode acme route on a Manager without an
// ACME directory.
var ErrNoACME = errors.New("berth: no ACME directory is configured (berthd --acme-directory)")

// ErrWithdrawn is returned by an order for a hostname no route asks a
// certificate for any more: it stops before any request reaches the CA.
var ErrWithdrawn = errors.New("berth: no route asks a certificate for this hostname any more")

// acmeIssuer is the [certmagic.Issuer] that orders from the configured ACME
// directory with the solvers of [Manager]: DNS-01 through the TXT publisher
// for wildcards and names under a DNS-01 zone, HTTP-01 through the route
// table otherwise (docs/certificates.md section 2).
type acmeIssuer struct {
	m      *Manager
	client *http.Client

	mu   sync.Mutex
	acct *acme.Account // registered account, once loaded or made
}

var _ certmagic.Issuer = (*acmeIssuer)(nil)

// IssuerKey names the directory: certificates from two directories never
// overwrite each other in storage.
func (i *acmeIssuer) IssuerKey() string {
	sum := sha256.Sum256([]byte(i.m.cfg.DirectoryURL))
	return "acme-" + hex.EncodeToString(sum[:8])
}

type storedAccount struct {
	Location string   `json:"location"`
	KeyPEM   string   `json:"key_pem"`
	Contact  []string `json:"contact,omitempty"`
}

func (i *acmeIssuer) accountKey() string { return "acme/" + i.IssuerKey() + "/account.json" }

func (i *acmeIssuer) acmeClient(solvers map[string]acmez.Solver) *acmez.Client {
	return &acmez.Client{
		Client: &acme.Client{
			Directory:  i.m.cfg.DirectoryURL,
			HTTPClient: i.client,
			UserAgent:  "berthd",
			Logger:     i.m.log.With("component", "acme"),
		},
		ChallengeSolvers: solvers,
	}
}

// account returns the registered ACME account: the one in storage, or a new
// one registered (and stored sealed) when storage has none or fresh is set.
func (i *acmeIssuer) account(ctx context.Context, fresh bool) (acme.Account, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.acct != nil && !fresh {
		return *i.acct, nil
	}
	if !fresh {
		raw, err := i.m.storage.Load(ctx, i.accountKey())
		switch {
		case err == nil:
			var sa storedAccount
			if err := json.Unmarshal(raw, &sa); err != nil {
				return acme.Account{}, fmt.Errorf("certs: decode stored ACME account: %w", err)
			}
			key, err := parseKey([]byte(sa.KeyPEM))
			if err != nil {
				return acme.Account{}, fmt.Errorf("certs: stored ACME account key: %w", err)
			}
			a := acme.Account{Status: acme.StatusValid, Location: sa.Location, Contact: sa.Contact, PrivateKey: key}
			i.acct = &a
			return a, nil
		case !errors.Is(err, fs.ErrNotExist):
			return acme.Account{}, err
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return acme.Account{}, fmt.Errorf("certs: account key: %w", err)
	}
	a := acme.Account{TermsOfServiceAgreed: true, PrivateKey: key}
	if i.m.cfg.Email != "" {
		a.Contact = []string{"mailto:" + i.m.cfg.Email}
	}
	a, err = i.acmeClient(nil).NewAccount(ctx, a)
	if err != nil {
		return acme.Account{}, fmt.Errorf("certs: register ACME account at %s: %w", i.m.cfg.DirectoryURL, err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return acme.Account{}, fmt.Errorf("certs: encode account key: %w", err)
	}
	raw, _ := json.Marshal(storedAccount{Location: a.Location, Contact: a.Contact,
		KeyPEM: string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))}) // plain struct
	if err := i.m.storage.Store(ctx, i.accountKey(), raw); err != nil {
		return acme.Account{}, err
	}
	i.acct = &a
	return a, nil
}

// Issue orders a certificate for csr's names, which must all still be
// wanted by a route (else [ErrWithdrawn], before any request). A CA
// refusal comes back wrapping its [acme.Problem]. An account the CA no
// longer knows is registered anew once.
func (i *acmeIssuer) Issue(ctx context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	for _, n := range csr.DNSNames {
		if !i.m.wanted(n) {
			return nil, fmt.Errorf("certs: order %s: %w", n, ErrWithdrawn)
		}
	}
	solvers, err := i.m.solversFor(csr.DNSNames)
	if err != nil {
		return nil, err
	}
	i.m.metrics.orders.Inc()
	for attempt := 0; ; attempt++ {
		acct, err := i.account(ctx, attempt > 0)
		if err != nil {
			return nil, err
		}
		params, err := acmez.OrderParametersFromCSR(acct, csr)
		if err != nil {
			return nil, fmt.Errorf("certs: order %v: %w", csr.DNSNames, err)
		}
		chains, err := i.acmeClient(solvers).ObtainCertificate(ctx, params)
		var p acme.Problem
		if err != nil && attempt == 0 && errors.As(err, &p) && p.Type == acme.ProblemTypeAccountDoesNotExist {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("certs: order %v: %w", csr.DNSNames, err)
		}
		if len(chains) == 0 {
			return nil, fmt.Errorf("certs: order %v: the CA returned no certificate", csr.DNSNames)
		}
		return &certmagic.IssuedCertificate{Certificate: chains[0].ChainPEM}, nil
	}
}

// parseKey decodes a PEM private key (PKCS#8, EC or PKCS#1).
func parseKey(pemBytes []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(pemBytes)
	if b == nil {
		return nil, errors.New("no PEM block")
	}
	if k, err := x509.ParsePKCS8PrivateKey(b.Bytes); err == nil {
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("key type %T cannot sign", k)
		}
		return s, nil
	}
	if k, err := x509.ParseECPrivateKey(b.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(b.Bytes); err == nil {
		return k, nil
	}
	return nil, errors.New("not a PKCS#8, EC or PKCS#1 private key")
}
