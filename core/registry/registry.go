// Package registry serves Berth's OCI registry at /v2 on berthd's API
// listener: distribution v3 as a library, behind Berth's own token flow.
package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	v2 "github.com/distribution/distribution/v3/registry/api/v2"
	"github.com/distribution/distribution/v3/registry/handlers"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the filesystem storage driver
	_ "github.com/distribution/distribution/v3/registry/storage/driver/s3-aws"     // the S3 storage driver
	"github.com/gorilla/mux"
	digest "github.com/opencontainers/go-digest"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/identity"
)

// Service is the "service" name of the token flow (docs/registry.md section 3).
const Service = "berth"

// CatalogMaxEntries is the most repositories one /v2/_catalog page returns.
const CatalogMaxEntries = 1000

// Authenticator checks a Berth bearer (brt_ machine token or brs_ human
// session); [identity.Tokens] implements it. Both methods return exactly
// identity.ErrUnauthenticated for any credential failure, and another
// error only when the store cannot answer.
type Authenticator interface {
	// Authenticate is asked once per registry bearer, at /v2/token.
	Authenticate(ctx context.Context, token string) (*identity.Principal, error)
	// Recheck is asked on every request made with a registry bearer, with
	// the SHA-256 digest of the Berth bearer it was issued to, and answers
	// what Authenticate would answer for that bearer now (revoked, expired,
	// or a session whose user's credentials changed: ErrUnauthenticated).
	// It is on every request's path, so it should answer from memory
	// ([identity.Tokens.Recheck] reads the store's read view).
	Recheck(ctx context.Context, digest string) (*identity.Principal, error)
}

// NodeAuthenticator checks a node credential (brn_) and returns the node's
// id; any failure is identity.ErrUnauthenticated or a store error.
type NodeAuthenticator func(ctx context.Context, credential string) (nodeID string, err error)

// NodeChecker is asked on every request made with a registry bearer issued
// to a node credential, with the node's id and the SHA-256 digest of that
// credential: nil while the node is enrolled under that credential;
// identity.ErrUnauthenticated once the node is removed or holds another
// credential; another error when the store cannot answer. It is on every
// request's path, so it should answer from memory.
type NodeChecker func(ctx context.Context, nodeID, credentialDigest string) error

// NodeImages returns the image references ("<repo>@sha256:<hex>") in the
// desired state of a node.
type NodeImages func(ctx context.Context, nodeID string) ([]string, error)

// Push is one manifest written under a tag or digest (a push hook).
type Push struct {
	Repository string // "<project>/<name>"
	Reference  string // the tag or digest the client pushed to
	Digest     string // the manifest's digest, "sha256:<hex>"
	MediaType  string
	Actor      string // principal id
	ActorKind  identity.Kind
}

// Config wires a [Registry]. Zero values take the documented defaults.
type Config struct {
	// RootDir is where the filesystem backend keeps repositories; required
	// unless S3.Endpoint is set.
	RootDir string
	// S3, when Endpoint is set, keeps repositories in that bucket under
	// Prefix + "registry" instead (credentials as [blobs.S3Config] reads them).
	S3 blobs.S3Config
	// Key signs registry bearers and upload state; at least 32 bytes, the
	// same on every berthd replica (server derives it from the cluster key).
	Key []byte
	// Tokens authenticates Berth tokens; required.
	Tokens Authenticator
	// Nodes, NodeCurrent and NodeImages let node credentials pull what
	// they run; Nodes nil: node credentials are refused. NodeCurrent is
	// required when Nodes is set.
	Nodes       NodeAuthenticator
	NodeCurrent NodeChecker
	NodeImages  NodeImages
	// Authorize, when not nil, is asked before each push of a manifest, and
	// may refuse it (reserved release tags); an error wrapping ErrDenied
	// answers DENIED, another error UNAVAILABLE.
	Authorize func(ctx context.Context, p Push) error
	// OnPush, when not nil, is called for each manifest written, once the
	// registry stored it and before the client is answered; an error
	// answers 503 (the client retries the idempotent PUT).
	OnPush func(ctx context.Context, p Push) error
	// TagDigest, when not nil, makes a record the truth of what each tag
	// names ([Releases.TagDigest]): it answers the digest repo:tag names
	// ("" for none). A manifest PUT to a tag is then stored by digest, without
	// moving the tag; OnPush records it; and the repository's tag is written
	// to the digest TagDigest answers, read again until it holds still, so
	// that the tag and its record name the same digest whatever order
	// concurrent pushes land in (docs/registry.md section 7). It requires
	// OnPush. nil: distribution moves the tag itself.
	TagDigest func(ctx context.Context, repo, tag string) (string, error)
	// Referrers keeps the referrers index (docs/registry.md section 6);
	// nil: a store built from RootDir or S3 like the repositories'.
	Referrers blobs.Store
	// UploadExpiry is how old an unfinished upload grows before it is
	// purged; zero: 24 h.
	UploadExpiry time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
}

// ErrDenied is what Config.Authorize wraps to refuse a push.
var ErrDenied = errors.New("berth: registry push denied")

// Registry is the /v2 handler: the token endpoint and, behind the token
// check, distribution's registry application.
type Registry struct {
	cfg    Config
	app    *handlers.App
	router *mux.Router
	log    *slog.Logger

	// The storage as the garbage collector walks it (gc.go), when it
	// started serving, and when each digest was last named by a request.
	drv     storagedriver.StorageDriver
	ns      distribution.Namespace
	started time.Time
	used    usage
}

// New builds the registry. It does not start listening; serve it with
// [Registry.ServeHTTP] for paths under /v2/. ctx bounds the application's
// background work (the upload purger). Errors: a configuration the
// storage driver refuses.
func New(ctx context.Context, cfg Config) (r *Registry, err error) {
	if cfg.Tokens == nil {
		return nil, errors.New("registry: Tokens is required")
	}
	if len(cfg.Key) < 32 {
		return nil, errors.New("registry: Key must hold at least 32 bytes")
	}
	if cfg.Nodes != nil && cfg.NodeCurrent == nil {
		return nil, errors.New("registry: NodeCurrent is required with Nodes")
	}
	if cfg.TagDigest != nil && cfg.OnPush == nil {
		return nil, errors.New("registry: TagDigest needs OnPush to record what it answers")
	}
	if cfg.RootDir == "" && cfg.S3.Endpoint == "" {
		return nil, errors.New("registry: RootDir or S3 is required")
	}
	if cfg.UploadExpiry <= 0 {
		cfg.UploadExpiry = 24 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Referrers == nil {
		if cfg.S3.Endpoint != "" {
			s3, err := blobs.NewS3(cfg.S3)
			if err != nil {
				return nil, err
			}
			cfg.Referrers = s3
		} else {
			fs, err := blobs.NewFS(filepath.Join(cfg.RootDir, "_berth"))
			if err != nil {
				return nil, err
			}
			cfg.Referrers = fs
		}
	}
	dc, err := appConfig(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		// distribution panics on a configuration its driver refuses.
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("registry: %v", p)
		}
	}()
	app := handlers.NewApp(ctx, dc)
	drv, ns, err := storageFor(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Registry{cfg: cfg, app: app, router: v2.Router(), log: cfg.Logger, drv: drv, ns: ns, started: cfg.Now()}, nil
}

// appConfig is distribution's configuration, built in code.
func appConfig(cfg Config) (*configuration.Configuration, error) {
	dc := &configuration.Configuration{}
	dc.Catalog.MaxEntries = CatalogMaxEntries
	secret := sha256.Sum256(append([]byte("berth registry upload state v1\x00"), cfg.Key...))
	dc.HTTP.Secret = hex.EncodeToString(secret[:])
	dc.HTTP.RelativeURLs = true
	// External URLs in manifests (foreign layers) must be http(s).
	dc.Validation.Manifests.URLs.Allow = []string{`^https?://`}
	st := configuration.Storage{
		"delete":   configuration.Parameters{"enabled": true},
		"redirect": configuration.Parameters{"disable": true},
		"maintenance": configuration.Parameters{"uploadpurging": map[any]any{
			"enabled": true, "age": cfg.UploadExpiry.String(), "interval": "1h", "dryrun": false,
		}},
	}
	if cfg.S3.Endpoint != "" {
		p, err := s3Parameters(cfg.S3)
		if err != nil {
			return nil, err
		}
		st["s3"] = p
	} else {
		st["filesystem"] = configuration.Parameters{"rootdirectory": cfg.RootDir}
	}
	dc.Storage = st
	return dc, nil
}

// s3Parameters is the s3-aws driver's configuration for c.
func s3Parameters(c blobs.S3Config) (configuration.Parameters, error) {
	id, secret, err := blobs.ResolveCredentials(c)
	if err != nil {
		return nil, err
	}
	scheme := "https://"
	if c.Insecure {
		scheme = "http://"
	}
	region := c.Region
	if region == "" {
		region = "us-east-1"
	}
	root := "/" + strings.TrimSuffix(c.Prefix, "/")
	if root == "/" {
		root = "/registry"
	} else {
		root += "/registry"
	}
	return configuration.Parameters{
		"accesskey": id, "secretkey": secret, "region": region, "bucket": c.Bucket,
		"regionendpoint": scheme + c.Endpoint, "forcepathstyle": true, "secure": !c.Insecure,
		"rootdirectory": root, "chunksize": 16 << 20,
	}, nil
}

// Close stops the application's background work.
func (r *Registry) Close() {}

// ServeHTTP serves /v2/token and every registry route under /v2/.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if req.URL.Path == "/v2/token" {
		r.serveToken(w, req)
		return
	}
	if m := referrersPath.FindStringSubmatch(req.URL.Path); m != nil {
		r.serveReferrersAuthed(w, req, m[1], m[2])
		return
	}
	n, ok, badName := classify(r.router, req)
	if badName {
		serveError(w, http.StatusBadRequest, errcode.ErrorCodeNameInvalid.WithMessage("repository names are <project>/<name>: lower-case letters, digits and separators, no empty or dot-only components"))
		return
	}
	if !ok {
		// Let distribution answer (404, 405) with its own error bodies,
		// but only to an authenticated caller.
		if _, _, err := r.bearer(req); err != nil {
			r.refuse(w, req, need{}, err)
			return
		}
		r.serveApp(w, req)
		return
	}
	c, p, err := r.bearer(req)
	if err != nil {
		r.refuse(w, req, n, err)
		return
	}
	if n.resource != "" {
		granted, asked := c.Access[n.resource]
		if !allows(granted, n.action) {
			if !asked {
				r.challenge(w, req, n)
				return
			}
			msg := "not allowed to " + n.action + " " + n.resource
			if n.resource == catalogResource {
				msg = "not allowed to list repositories: this credential may read no project's images (services:read in a project)"
			}
			serveError(w, http.StatusForbidden, errcode.ErrorCodeDenied.WithMessage(msg))
			return
		}
		if p != nil && !stillAllows(p, n) {
			// The principal lost the grant since the bearer was issued (a
			// session's roles changed): a new bearer says what it may do now.
			r.challenge(w, req, n)
			return
		}
	}
	if c.Kind == string(identity.KindNode) && n.route == v2.RouteNameManifest && !r.nodeMayPull(req.Context(), c.Node, n) {
		serveError(w, http.StatusForbidden, errcode.ErrorCodeDenied.WithMessage("a node pulls only the digests of its desired state"))
		return
	}
	if n.route == v2.RouteNameCatalog && p != nil && !p.Has(identity.ScopeServicesRead) {
		// A credential bounded to projects sees only their repositories.
		r.serveCatalog(w, req, p)
		return
	}
	r.touch(req, n)
	if n.route == v2.RouteNameBlobUpload && req.Method == http.MethodPost {
		if from := req.URL.Query().Get("from"); from != "" && validRepo(from) && req.URL.Query().Get("mount") != "" {
			if _, asked := c.Access["repository:"+from]; !asked {
				// Ask for the source's pull as well, as distribution's own
				// token auth does.
				r.challenge(w, req, n, "repository:"+from+":pull")
				return
			}
		}
		r.checkMount(req, c, p)
	}
	if n.route == v2.RouteNameManifest && req.Method == http.MethodPut {
		r.servePush(w, req, n, c)
		return
	}
	sw := r.serveApp(w, req)
	if n.route == v2.RouteNameManifest && req.Method == http.MethodDelete && sw.status/100 == 2 && digestRE.MatchString(n.ref) {
		if err := r.forgetReferrer(req.Context(), n.repo, n.ref); err != nil {
			r.log.Error("registry: forget referrer", "repository", n.repo, "digest", n.ref, "err", err)
		}
	}
}

// touch records the digests an authenticated request names (a manifest or
// blob by digest, an upload's completing digest, a mount's blob), so that
// the garbage collector keeps them for its grace period (gc.go).
func (r *Registry) touch(req *http.Request, n need) {
	now := r.cfg.Now()
	for _, s := range []string{n.ref, req.URL.Query().Get("digest"), req.URL.Query().Get("mount")} {
		if d, err := digest.Parse(s); err == nil {
			r.used.touch(d, now)
		}
	}
}

// checkMount drops a cross-repository mount (?mount=<digest>&from=<repo>)
// whose source the bearer may not pull: the request then starts an
// ordinary upload (202), as the distribution spec lets a registry do, and
// no blob of a repository the caller cannot read is ever linked into its own.
func (r *Registry) checkMount(req *http.Request, c claims, p *identity.Principal) {
	q := req.URL.Query()
	from := q.Get("from")
	if q.Get("mount") == "" && from == "" {
		return
	}
	if from != "" && validRepo(from) && allows(c.Access["repository:"+from], ActionPull) &&
		(p == nil || slices.Contains(grantFor(p, from, []string{ActionPull}), ActionPull)) {
		return
	}
	q.Del("mount")
	q.Del("from")
	req.URL.RawQuery = q.Encode()
	req.Form = nil
}

// serveReferrersAuthed checks the bearer for pull on repo and serves the
// referrers of subject.
func (r *Registry) serveReferrersAuthed(w http.ResponseWriter, req *http.Request, repo, subject string) {
	if !validRepo(repo) {
		serveError(w, http.StatusBadRequest, errcode.ErrorCodeNameInvalid.WithMessage("repository names are <project>/<name>"))
		return
	}
	n := need{resource: "repository:" + repo, repo: repo, action: ActionPull, ref: subject}
	c, p, err := r.bearer(req)
	if err != nil {
		r.refuse(w, req, n, err)
		return
	}
	granted, asked := c.Access[n.resource]
	if !allows(granted, ActionPull) {
		if !asked {
			r.challenge(w, req, n)
			return
		}
		serveError(w, http.StatusForbidden, errcode.ErrorCodeDenied.WithMessage("not allowed to pull "+n.resource))
		return
	}
	if p != nil && !stillAllows(p, n) {
		r.challenge(w, req, n)
		return
	}
	r.serveReferrers(w, req, repo, subject)
}

func allows(granted []string, action string) bool {
	for _, g := range granted {
		if g == action || g == "*" {
			return true
		}
	}
	return false
}

// nodeMayPull reports whether the node's desired state names the manifest
// digest n.ref in n.repo.
func (r *Registry) nodeMayPull(ctx context.Context, node string, n need) bool {
	if r.cfg.NodeImages == nil || !strings.HasPrefix(n.ref, "sha256:") {
		return false
	}
	imgs, err := r.cfg.NodeImages(ctx, node)
	if err != nil {
		r.log.Warn("registry: node images unavailable", "node", node, "err", err)
		return false
	}
	for _, ref := range imgs {
		if ref == n.repo+"@"+n.ref || strings.HasSuffix(ref, "/"+n.repo+"@"+n.ref) {
			return true
		}
	}
	return false
}

// servePush checks the manifest (checkManifest), asks Authorize, serves
// the manifest PUT and, before answering a stored manifest, records its
// referrer entry and reports it to OnPush. With TagDigest, a PUT to a tag
// stores the manifest by digest and then moves the tag to what the record
// names (syncTag), whether OnPush succeeded or not: the tag never names what
// its record does not.
func (r *Registry) servePush(w http.ResponseWriter, req *http.Request, n need, c claims) {
	p := Push{Repository: n.repo, Reference: n.ref, Actor: c.Subject, ActorKind: identity.Kind(c.Kind), MediaType: req.Header.Get("Content-Type")}
	body, ok := readManifestBody(req)
	if ok {
		err := r.checkManifest(req.Context(), n.repo, body, p.MediaType)
		var refused errManifestRefused
		if errors.As(err, &refused) {
			serveError(w, http.StatusBadRequest, refused.e)
			return
		} else if err != nil {
			r.log.Error("registry: check manifest", "repository", n.repo, "reference", n.ref, "err", err)
			serveError(w, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry's storage is unavailable; retry later"))
			return
		}
		sum := sha256.Sum256(body)
		p.Digest = "sha256:" + hex.EncodeToString(sum[:])
		if d, err := digest.Parse(p.Digest); err == nil {
			r.used.touch(d, r.cfg.Now())
		}
	}
	if r.cfg.Authorize != nil && ok {
		if err := r.cfg.Authorize(req.Context(), p); errors.Is(err, ErrDenied) {
			serveError(w, http.StatusForbidden, errcode.ErrorCodeDenied.WithMessage(err.Error()))
			return
		} else if err != nil {
			r.log.Error("registry: push check failed", "repository", n.repo, "reference", n.ref, "err", err)
			serveError(w, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry cannot serve this right now"))
			return
		}
	}
	subject, ref, isReferrer := "", descriptor{}, false
	if ok {
		subject, ref, isReferrer = referrerOf(body, p.MediaType)
	}
	byTag := ok && r.cfg.TagDigest != nil && !isDigestRef(n.ref)
	if byTag {
		// Distribution stores the manifest by digest and leaves the tag
		// alone; syncTag moves it once the push is recorded.
		req.URL.Path = strings.TrimSuffix(req.URL.Path, "/manifests/"+n.ref) + "/manifests/" + p.Digest
		req.URL.RawPath = ""
	}
	rec := &statusWriter{ResponseWriter: w, req: req, log: r.log}
	rec.before = func(code int) int {
		if code/100 != 2 {
			return code
		}
		if isReferrer {
			if err := r.recordReferrer(req.Context(), n.repo, subject, ref); err != nil {
				r.log.Error("registry: record referrer", "repository", n.repo, "subject", subject, "err", err)
				return http.StatusServiceUnavailable
			}
			w.Header().Set("OCI-Subject", subject)
		}
		var pushErr error
		if r.cfg.OnPush != nil {
			if d := w.Header().Get("Docker-Content-Digest"); d != "" {
				p.Digest = d
			}
			if pushErr = r.cfg.OnPush(req.Context(), p); pushErr != nil {
				r.log.Error("registry: record push", "repository", n.repo, "reference", n.ref, "err", pushErr)
			}
		}
		if byTag {
			// Also when OnPush failed: whatever it recorded or not, the tag
			// names what the record names.
			if err := r.syncTag(req.Context(), n.repo, n.ref); err != nil {
				r.log.Error("registry: move tag to its record", "repository", n.repo, "tag", n.ref, "err", err)
				return http.StatusServiceUnavailable
			}
		}
		if pushErr != nil {
			return http.StatusServiceUnavailable
		}
		return code
	}
	r.app.ServeHTTP(rec, req)
}

// isDigestRef reports whether a manifest reference is a digest rather than
// a tag (the tag grammar has no ':').
func isDigestRef(ref string) bool { return strings.Contains(ref, ":") }

// statusWriter records the status distribution answers, and turns its
// server errors (a storage backend that cannot be reached) into 503
// UNAVAILABLE with one log line, the body it wrote discarded.
type statusWriter struct {
	http.ResponseWriter
	status  int
	swallow bool
	before  func(code int) int // nil, or called with the status before it is written; may change it
	req     *http.Request
	log     *slog.Logger
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status != 0 {
		return
	}
	if s.before != nil {
		code = s.before(code)
	}
	s.status = code
	if code >= 500 {
		s.swallow = true
		s.log.Error("registry: storage failed; answering 503", "method", s.req.Method, "path", s.req.URL.Path, "status", code)
		s.ResponseWriter.Header().Del("Content-Length")
		serveError(s.ResponseWriter, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry's storage is unavailable; retry later"))
		return
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	if s.swallow {
		return len(b), nil
	}
	return s.ResponseWriter.Write(b)
}

// ReadFrom keeps the server's sendfile path for blob downloads.
func (s *statusWriter) ReadFrom(src io.Reader) (int64, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	if s.swallow {
		return io.Copy(io.Discard, src)
	}
	if rf, ok := s.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(s.ResponseWriter, src)
}

// Flush passes a flush through when the server supports it.
func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// serveApp hands the request to distribution through a statusWriter.
func (r *Registry) serveApp(w http.ResponseWriter, req *http.Request) *statusWriter {
	sw := &statusWriter{ResponseWriter: w, req: req, log: r.log}
	r.app.ServeHTTP(sw, req)
	return sw
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// bearer returns the verified claims of the request's registry bearer and,
// for a Berth token or session, the principal it stands for now (nil for a
// node). The bearer's MAC and expiry are checked, and then the Berth
// credential it was issued to, on every request: once that credential is
// revoked, expired, rotated away, a session's user changed credentials, or
// a node is removed, its bearers stop working at once rather than when they
// expire (docs/registry.md section 3). Errors: exactly
// identity.ErrUnauthenticated for every refusal; another error when the
// check could not be made (the store is unavailable).
func (r *Registry) bearer(req *http.Request) (claims, *identity.Principal, error) {
	tok, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return claims{}, nil, identity.ErrUnauthenticated
	}
	c, err := verify(r.cfg.Key, strings.TrimSpace(tok), r.cfg.Now())
	if err != nil {
		return claims{}, nil, identity.ErrUnauthenticated
	}
	cred, err := openCred(r.cfg.Key, c.Cred)
	if err != nil {
		return claims{}, nil, identity.ErrUnauthenticated
	}
	ctx := req.Context()
	if c.Kind == string(identity.KindNode) {
		if r.cfg.NodeCurrent == nil || c.Node == "" {
			return claims{}, nil, identity.ErrUnauthenticated
		}
		if err := r.cfg.NodeCurrent(ctx, c.Node, cred); err != nil {
			return claims{}, nil, err
		}
		return c, nil, nil
	}
	p, err := r.cfg.Tokens.Recheck(ctx, cred)
	if err != nil {
		return claims{}, nil, err
	}
	if p == nil || p.ID != c.Subject || string(p.Kind) != c.Kind {
		return claims{}, nil, identity.ErrUnauthenticated
	}
	return c, p, nil
}

// refuse answers a request whose bearer [Registry.bearer] refused: a new
// challenge for a refused credential, 503 UNAVAILABLE (and one log line)
// when the check could not be made.
func (r *Registry) refuse(w http.ResponseWriter, req *http.Request, n need, err error) {
	if errors.Is(err, identity.ErrUnauthenticated) {
		r.challenge(w, req, n)
		return
	}
	r.log.Error("registry: recheck bearer", "err", err)
	serveError(w, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry cannot serve this right now"))
}

// stillAllows reports whether p may still take n's action on n's resource.
func stillAllows(p *identity.Principal, n need) bool {
	switch {
	case n.resource == catalogResource:
		return mayListCatalog(p)
	case n.repo != "":
		return slices.Contains(grantFor(p, n.repo, []string{n.action}), n.action)
	}
	return true
}

// challenge answers 401 with Docker's bearer challenge for n.
func (r *Registry) challenge(w http.ResponseWriter, req *http.Request, n need, extra ...string) {
	realm := realmURL(req)
	v := fmt.Sprintf(`Bearer realm=%q,service=%q`, realm, Service)
	if n.resource != "" {
		actions := n.action
		if n.action == ActionPush {
			actions = "pull,push"
		}
		v += fmt.Sprintf(`,scope=%q`, strings.Join(append([]string{n.resource + ":" + actions}, extra...), " "))
	}
	w.Header().Set("WWW-Authenticate", v)
	serveError(w, http.StatusUnauthorized, errcode.ErrorCodeUnauthorized.WithMessage("authentication required"))
}

// realmURL is the token endpoint on the host the client used. A request a cluster relay carried
// came over the relay's TLS listener (the relay terminates it), so its realm is https on the
// relay's origin, the Host the node asked (docs/relay.md section 12).
func realmURL(req *http.Request) string {
	scheme := "https"
	if _, carried := clusters.CarrierFrom(req.Context()); req.TLS == nil && !carried {
		scheme = "http"
	}
	return (&url.URL{Scheme: scheme, Host: req.Host, Path: "/v2/token"}).String()
}

func serveError(w http.ResponseWriter, status int, e errcode.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(errcode.Errors{e})
}

// tokenResponse is the token endpoint's answer (docs/registry.md section 3).
type tokenResponse struct {
	Token       string `json:"token"`
	AccessToken string `json:"access_token"`
	ExpiresIn   int    `json:"expires_in"`
	IssuedAt    string `json:"issued_at"`
}

// serveToken is GET /v2/token?service=berth&scope=repository:shop/web:pull,push
// (and the OAuth2 POST form with grant_type=password): the Berth bearer is
// the password of HTTP Basic authentication, or a Bearer header.
func (r *Registry) serveToken(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodPost {
		serveError(w, http.StatusMethodNotAllowed, errcode.ErrorCodeUnsupported.WithMessage("use GET or POST"))
		return
	}
	if req.URL.Query().Has("password") || req.URL.Query().Has("access_token") {
		serveError(w, http.StatusBadRequest, errcode.ErrorCodeUnauthorized.WithMessage("credentials never travel in the URL"))
		return
	}
	var cred string
	var scopes []string
	for _, v := range req.URL.Query()["scope"] {
		// One parameter may carry several scopes, space-separated.
		scopes = append(scopes, strings.Fields(v)...)
	}
	if _, pw, ok := req.BasicAuth(); ok {
		cred = pw
	} else if b, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer "); ok {
		cred = strings.TrimSpace(b)
	}
	if req.Method == http.MethodPost {
		req.Body = http.MaxBytesReader(w, req.Body, 64<<10)
		if err := req.ParseForm(); err == nil {
			if cred == "" && req.PostForm.Get("grant_type") == "password" {
				cred = req.PostForm.Get("password")
			}
			for _, s := range req.PostForm["scope"] {
				scopes = append(scopes, strings.Fields(s)...)
			}
		}
	}
	c, err := r.authenticate(req.Context(), cred)
	if errors.Is(err, identity.ErrUnauthenticated) {
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Basic realm=%q`, Service))
		serveError(w, http.StatusUnauthorized, errcode.ErrorCodeUnauthorized.WithMessage("authentication failed"))
		return
	}
	if err != nil {
		r.log.Error("registry: authenticate", "err", err)
		serveError(w, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry cannot serve this right now"))
		return
	}
	if err := r.grant(req.Context(), &c, scopes); err != nil {
		r.log.Error("registry: grant", "err", err)
		serveError(w, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry cannot serve this right now"))
		return
	}
	now := r.cfg.Now()
	c.IssuedAt, c.ExpiresAt = now.Unix(), now.Add(TokenTTL).Unix()
	c.Cred, err = sealCred(r.cfg.Key, c.digest)
	if err != nil {
		r.log.Error("registry: issue bearer", "err", err)
		serveError(w, http.StatusInternalServerError, errcode.ErrorCodeUnknown.WithMessage("internal error"))
		return
	}
	tok, err := sign(r.cfg.Key, c.claims)
	if err != nil {
		serveError(w, http.StatusInternalServerError, errcode.ErrorCodeUnknown.WithMessage("internal error"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(tokenResponse{Token: tok, AccessToken: tok, ExpiresIn: int(TokenTTL / time.Second), IssuedAt: now.UTC().Format(time.RFC3339)})
}

// principal is who a credential is, kept for granting.
type principal struct {
	claims
	p      *identity.Principal // nil for nodes
	digest string              // identity.Digest of the credential, for claims.Cred
}

func (r *Registry) authenticate(ctx context.Context, cred string) (principal, error) {
	if cred == "" {
		return principal{}, identity.ErrUnauthenticated
	}
	if strings.HasPrefix(cred, identity.PrefixNode) {
		if r.cfg.Nodes == nil {
			return principal{}, identity.ErrUnauthenticated
		}
		id, err := r.cfg.Nodes(ctx, cred)
		if err != nil {
			return principal{}, err
		}
		return principal{claims: claims{Subject: id, Kind: string(identity.KindNode), Node: id}, digest: identity.Digest(cred)}, nil
	}
	p, err := r.cfg.Tokens.Authenticate(ctx, cred)
	if err != nil {
		return principal{}, err
	}
	return principal{claims: claims{Subject: p.ID, Kind: string(p.Kind)}, p: p, digest: identity.Digest(cred)}, nil
}

// grant fills c.Access for the requested scopes: each one asked about is
// recorded, with the actions the principal may take (possibly none).
func (r *Registry) grant(ctx context.Context, c *principal, scopes []string) error {
	c.Access = map[string][]string{}
	var nodeImgs []string
	for _, s := range scopes {
		typ, rest, ok := strings.Cut(s, ":")
		if !ok {
			continue
		}
		i := strings.LastIndex(rest, ":")
		if i < 0 {
			continue
		}
		name, actions := rest[:i], strings.Split(rest[i+1:], ",")
		res := typ + ":" + name
		switch {
		case typ == "registry" && name == "catalog":
			if mayListCatalog(c.p) {
				c.Access[res] = []string{"*"}
			} else {
				c.Access[res] = nil
			}
		case typ == "repository" && validRepo(name):
			if c.p != nil {
				c.Access[res] = append(c.Access[res], grantFor(c.p, name, actions)...)
				continue
			}
			// A node: pull from repositories its desired state names.
			if nodeImgs == nil && r.cfg.NodeImages != nil {
				imgs, err := r.cfg.NodeImages(ctx, c.Node)
				if err != nil {
					return err
				}
				nodeImgs = append(imgs, "")
			}
			c.Access[res] = nil
			for _, ref := range nodeImgs {
				repo, _, _ := strings.Cut(ref, "@")
				if (repo == name || strings.HasSuffix(repo, "/"+name)) && contains(actions, ActionPull) {
					c.Access[res] = []string{ActionPull}
				}
			}
		}
	}
	return nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
