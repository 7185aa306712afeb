package registry_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/internal/s3test"
)

// env is one registry under test with its tokens.
type env struct {
	srv    *httptest.Server
	host   string
	tokens *identity.Tokens
	mu     sync.Mutex
	pushes []registry.Push
	images map[string][]string // node id -> image refs
	rel    *registry.Releases
	reg    *registry.Registry
	st     *store.Store
	// nodes enrolls real nodes beside the one fixed credential nodeCred
	// (node nod_1, always current).
	nodes *nodes.Registry
	// follows, when set, is woken for every push recorded (deploy on push); its Run is the
	// test's to start.
	follows *registry.FollowWorker
}

const nodeCred = "brn_testnodecredential"

func newEnv(t *testing.T, s3 blobs.S3Config) *env { return newEnvAt(t, s3, nil) }

// newEnvAt is newEnv with the registry's and the releases' clock now (nil: time.Now).
func newEnvAt(t *testing.T, s3 blobs.S3Config, now func() time.Time) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := storetest.Open(t)
	e := &env{st: st, tokens: identity.NewTokens(st), images: map[string][]string{}, rel: registry.NewReleases(st, now),
		nodes: nodes.NewRegistry(st, now)}
	record := func(ctx context.Context, p registry.Push) error {
		e.mu.Lock()
		follows := e.follows
		e.mu.Unlock()
		if follows == nil {
			return e.rel.Record(ctx, p)
		}
		return follows.OnPush(ctx, p)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	reg, err := registry.New(ctx, registry.Config{
		RootDir: t.TempDir(), S3: s3, Key: key, Tokens: e.tokens, Now: now,
		Nodes: func(ctx context.Context, cred string) (string, error) {
			if cred == nodeCred {
				return "nod_1", nil
			}
			n, err := e.nodes.Authenticate(ctx, cred)
			if err != nil {
				return "", err
			}
			return n.ID, nil
		},
		NodeCurrent: func(ctx context.Context, id, credDigest string) error {
			if id == "nod_1" && credDigest == identity.Digest(nodeCred) {
				return nil
			}
			return e.nodes.CredentialCurrent(ctx, id, credDigest)
		},
		NodeImages: func(ctx context.Context, node string) ([]string, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.images[node], nil
		},
		Authorize: e.rel.CheckPush,
		TagDigest: e.rel.TagDigest,
		OnPush: func(ctx context.Context, p registry.Push) error {
			e.mu.Lock()
			e.pushes = append(e.pushes, p)
			e.mu.Unlock()
			return record(ctx, p)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.reg = reg
	e.srv = httptest.NewServer(reg)
	t.Cleanup(e.srv.Close)
	e.host = strings.TrimPrefix(e.srv.URL, "http://")
	return e
}

func (e *env) token(t *testing.T, project, service string, scopes ...identity.Scope) string {
	t.Helper()
	tok, _ := e.tokenID(t, project, service, scopes...)
	return tok
}

func (e *env) tokenID(t *testing.T, project, service string, scopes ...identity.Scope) (string, string) {
	t.Helper()
	tok, mt, err := e.tokens.CreateMachine(context.Background(), identity.MachineTokenRequest{
		Name: "ci-" + project + "-" + service + "-" + hex.EncodeToString([]byte(time.Now().Format("150405.000000000"))), Scopes: scopes, Project: project, Service: service})
	if err != nil {
		t.Fatal(err)
	}
	return tok, mt.ID
}

func (e *env) ref(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(e.host+"/"+s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func auth(tok string) remote.Option {
	return remote.WithAuth(&authn.Basic{Username: "berth", Password: tok})
}

// code returns the first registry error code of err, or "". A bodiless
// 403 (a HEAD) counts as DENIED.
func code(err error) string {
	var te *transport.Error
	if errors.As(err, &te) && len(te.Errors) > 0 {
		return string(te.Errors[0].Code)
	}
	if errors.As(err, &te) && te.StatusCode == http.StatusForbidden {
		return "DENIED"
	}
	return ""
}

func backends(t *testing.T) map[string]blobs.S3Config {
	srv := s3test.Start(t)
	return map[string]blobs.S3Config{
		"filesystem": {},
		"s3":         {Endpoint: srv.Addr, Bucket: srv.Bucket(t, "registry"), Insecure: true, AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey},
	}
}

func TestMain(m *testing.M) {
	// distribution logs every request through logrus; berthd silences it
	// the same way and logs server errors itself.
	logrus.SetOutput(io.Discard)
	os.Exit(m.Run())
}

func TestPushPullThroughBerthTokens(t *testing.T) {
	for bname, s3 := range backends(t) {
		t.Run(bname, func(t *testing.T) {
			e := newEnv(t, s3)
			img, err := random.Image(2048, 3)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := img.Digest()
			ci := e.token(t, "shop", "web", identity.ScopeServiceDeploy)
			if err := remote.Write(e.ref(t, "shop/web:v1"), img, auth(ci)); err != nil {
				t.Fatalf("push with a token of the project: %v", err)
			}
			got, err := remote.Image(e.ref(t, "shop/web:v1"), auth(ci))
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := got.Digest(); d != want {
				t.Fatalf("pulled %s, pushed %s", d, want)
			}
			ls, _ := got.Layers()
			if len(ls) != 3 {
				t.Fatalf("pulled %d layers", len(ls))
			}
			e.mu.Lock()
			pushes := append([]registry.Push(nil), e.pushes...)
			e.mu.Unlock()
			if len(pushes) != 1 || pushes[0].Repository != "shop/web" || pushes[0].Reference != "v1" || pushes[0].Digest != want.String() {
				t.Fatalf("push hook saw %+v, want shop/web:v1 at %s", pushes, want)
			}

			// A token of another project is denied, on pull and on push.
			other := e.token(t, "other", "", identity.ScopeServicesWrite)
			if _, err := remote.Image(e.ref(t, "shop/web:v1"), auth(other)); code(err) != "DENIED" {
				t.Fatalf("pull with another project's token: %v", err)
			}
			if err := remote.Write(e.ref(t, "shop/web:v2"), img, auth(other)); code(err) != "DENIED" {
				t.Fatalf("push with another project's token: %v", err)
			}
			// A service-bound token pushes only its service's repository.
			if err := remote.Write(e.ref(t, "shop/api:v1"), img, auth(ci)); code(err) != "DENIED" {
				t.Fatalf("push to another service's repository: %v", err)
			}
			// A read-only token pulls but does not push.
			ro := e.token(t, "shop", "", identity.ScopeServicesRead)
			if _, err := remote.Image(e.ref(t, "shop/web:v1"), auth(ro)); err != nil {
				t.Fatalf("pull with a read token: %v", err)
			}
			if err := remote.Write(e.ref(t, "shop/web:v3"), img, auth(ro)); code(err) != "DENIED" {
				t.Fatalf("push with a read token: %v", err)
			}
			// A wrong token fails at the token endpoint.
			if _, err := remote.Image(e.ref(t, "shop/web:v1"), auth("brt_"+strings.Repeat("A", 43))); code(err) != "UNAUTHORIZED" {
				t.Fatalf("pull with a wrong token: %v", err)
			}

			// A node pulls the digests its desired state names, nothing else.
			d := e.ref(t, "shop/web@"+want.String())
			if _, err := remote.Image(d, auth(nodeCred)); code(err) != "DENIED" {
				t.Fatalf("node pull before its desired state names the image: %v", err)
			}
			e.mu.Lock()
			e.images["nod_1"] = []string{e.host + "/shop/web@" + want.String()}
			e.mu.Unlock()
			if _, err := remote.Image(d, auth(nodeCred)); err != nil {
				t.Fatalf("node pull by digest: %v", err)
			}
			if _, err := remote.Image(e.ref(t, "shop/web:v1"), auth(nodeCred)); code(err) != "DENIED" {
				t.Fatalf("node pull by tag: %v", err)
			}
			if err := remote.Write(e.ref(t, "shop/web:evil"), img, auth(nodeCred)); code(err) != "DENIED" {
				t.Fatalf("node push: %v", err)
			}
		})
	}
}

// raw is a plain HTTP client of the registry with a bearer for scope.
func (e *env) bearer(t *testing.T, tok, scope string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v2/token?service=berth&scope="+scope, nil)
	req.SetBasicAuth("berth", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Token string }
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&out) != nil || out.Token == "" {
		t.Fatalf("token endpoint: %s", resp.Status)
	}
	return out.Token
}

func do(t *testing.T, method, url, bearer string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}

func errCode(b []byte) string {
	var out struct {
		Errors []struct{ Code string }
	}
	if json.Unmarshal(b, &out) != nil || len(out.Errors) == 0 {
		return ""
	}
	return out.Errors[0].Code
}

func TestBadInputGetsRegistryErrors(t *testing.T) {
	e := newEnv(t, blobs.S3Config{})
	ci := e.token(t, "shop", "", identity.ScopeServiceDeploy)

	// No credentials: 401, Docker's challenge, the registry's error body.
	resp, b := do(t, "GET", e.srv.URL+"/v2/shop/web/tags/list", "", nil)
	if resp.StatusCode != 401 || errCode(b) != "UNAUTHORIZED" {
		t.Fatalf("no credentials: %s %s", resp.Status, b)
	}
	if ch := resp.Header.Get("WWW-Authenticate"); !strings.Contains(ch, `realm="`+e.srv.URL+`/v2/token"`) || !strings.Contains(ch, `scope="repository:shop/web:pull"`) {
		t.Fatalf("challenge %q", ch)
	}
	// A forged or expired registry bearer is the same 401.
	resp, b = do(t, "GET", e.srv.URL+"/v2/", "e30.AAAA", nil)
	if resp.StatusCode != 401 || errCode(b) != "UNAUTHORIZED" {
		t.Fatalf("forged bearer: %s %s", resp.Status, b)
	}
	// A wrong Berth token at the token endpoint: 401 with the error body.
	req, _ := http.NewRequest("GET", e.srv.URL+"/v2/token?service=berth&scope=repository:shop/web:pull", nil)
	req.SetBasicAuth("x", "brt_wrong")
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 401 || errCode(b) != "UNAUTHORIZED" {
		t.Fatalf("wrong token: %s %s", r2.Status, b)
	}

	// Names with upper case, "..", or one component: NAME_INVALID.
	tok := e.bearer(t, ci, "repository:shop/web:pull,push")
	for _, n := range []string{"Shop/web", "shop/../web", "shop//web", "web"} {
		resp, b := do(t, "GET", e.srv.URL+"/v2/"+n+"/tags/list", tok, nil)
		if resp.StatusCode != 400 || errCode(b) != "NAME_INVALID" {
			t.Errorf("name %q: %s %s", n, resp.Status, b)
		}
	}

	// A blob whose bytes do not match its digest: DIGEST_INVALID, nothing stored.
	data := []byte("layer bytes")
	wrong := sha256.Sum256([]byte("other bytes"))
	wd := "sha256:" + hex.EncodeToString(wrong[:])
	resp, _ = do(t, "POST", e.srv.URL+"/v2/shop/web/blobs/uploads/", tok, nil)
	loc := resp.Header.Get("Location")
	if !strings.HasPrefix(loc, "http") {
		loc = e.srv.URL + loc
	}
	resp, b = do(t, "PUT", loc+"&digest="+wd, tok, data, "Content-Type", "application/octet-stream")
	if resp.StatusCode != 400 || errCode(b) != "DIGEST_INVALID" {
		t.Fatalf("wrong digest: %s %s", resp.Status, b)
	}
	if resp, _ := do(t, "HEAD", e.srv.URL+"/v2/shop/web/blobs/"+wd, tok, nil); resp.StatusCode != 404 {
		t.Fatalf("a refused blob is visible: %s", resp.Status)
	}

	// An upload abandoned halfway leaves no blob.
	resp, _ = do(t, "POST", e.srv.URL+"/v2/shop/web/blobs/uploads/", tok, nil)
	if resp.StatusCode != 202 {
		t.Fatalf("start upload: %s", resp.Status)
	}
	loc = resp.Header.Get("Location")
	if !strings.HasPrefix(loc, "http") {
		loc = e.srv.URL + loc
	}
	resp, _ = do(t, "PATCH", loc, tok, data[:5], "Content-Type", "application/octet-stream")
	if resp.StatusCode != 202 {
		t.Fatalf("upload chunk: %s", resp.Status)
	}
	full := sha256.Sum256(data)
	fd := "sha256:" + hex.EncodeToString(full[:])
	if resp, _ := do(t, "HEAD", e.srv.URL+"/v2/shop/web/blobs/"+fd, tok, nil); resp.StatusCode != 404 {
		t.Fatalf("a half-uploaded blob is visible: %s", resp.Status)
	}

	// A manifest over 4 MiB is refused.
	big := append([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","annotations":{"x":"`), bytes.Repeat([]byte("a"), 4<<20)...)
	big = append(big, []byte(`"}}`)...)
	resp, b = do(t, "PUT", e.srv.URL+"/v2/shop/web/manifests/big", tok, big, "Content-Type", "application/vnd.oci.image.manifest.v1+json")
	if resp.StatusCode/100 == 2 {
		t.Fatalf("a %d-byte manifest was accepted", len(big))
	}
	if resp, _ := do(t, "GET", e.srv.URL+"/v2/shop/web/manifests/big", tok, nil); resp.StatusCode != 404 {
		t.Fatalf("the oversized manifest is visible: %s", resp.Status)
	}

	// A manifest naming a blob never uploaded: MANIFEST_BLOB_UNKNOWN.
	img, _ := random.Image(64, 1)
	raw, _ := img.RawManifest()
	mt, _ := img.MediaType()
	resp, b = do(t, "PUT", e.srv.URL+"/v2/shop/web/manifests/missing", tok, raw, "Content-Type", string(mt))
	if resp.StatusCode != 400 || !strings.Contains(string(b), "MANIFEST_BLOB_UNKNOWN") {
		t.Fatalf("manifest with unknown blobs: %s %s", resp.Status, b)
	}
}

func TestUnreachableS3AnswersUnavailable(t *testing.T) {
	// Nothing listens at the endpoint: every storage call fails to connect.
	e := newEnv(t, blobs.S3Config{Endpoint: proctest.FreeAddr(t), Bucket: "gone", Insecure: true, AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey})
	ci := e.token(t, "shop", "", identity.ScopeServiceDeploy)
	tok := e.bearer(t, ci, "repository:shop/web:pull,push")
	resp, _ := do(t, "POST", e.srv.URL+"/v2/shop/web/blobs/uploads/", tok, nil)
	if resp.StatusCode == 202 {
		loc := resp.Header.Get("Location")
		if !strings.HasPrefix(loc, "http") {
			loc = e.srv.URL + loc
		}
		resp, _ = do(t, "PUT", loc+"&digest=sha256:"+strings.Repeat("0", 64), tok, []byte("x"), "Content-Type", "application/octet-stream")
	}
	resp2, b := do(t, "GET", e.srv.URL+"/v2/shop/web/tags/list", tok, nil)
	if resp.StatusCode != 503 || resp2.StatusCode != 503 || errCode(b) != "UNAVAILABLE" {
		t.Fatalf("push %s, list %s %s: want 503 UNAVAILABLE", resp.Status, resp2.Status, b)
	}
}

func TestCrossProjectMountFallsBackToUpload(t *testing.T) {
	e := newEnv(t, blobs.S3Config{})
	img, _ := random.Image(512, 1)
	a := e.token(t, "alpha", "", identity.ScopeServiceDeploy)
	if err := remote.Write(e.ref(t, "alpha/secret:v1"), img, auth(a)); err != nil {
		t.Fatal(err)
	}
	ls, _ := img.Layers()
	d, _ := ls[0].Digest()
	b := e.token(t, "beta", "", identity.ScopeServiceDeploy)
	// beta asks for a token covering alpha too; it is granted nothing there.
	tok := e.bearer(t, b, "repository:beta/app:pull,push&scope=repository:alpha/secret:pull")
	resp, _ := do(t, "POST", e.srv.URL+"/v2/beta/app/blobs/uploads/?mount="+d.String()+"&from=alpha/secret", tok, nil)
	if resp.StatusCode != 202 {
		t.Fatalf("mount from another project: %s, want 202 (an ordinary upload)", resp.Status)
	}
	if resp, _ := do(t, "HEAD", e.srv.URL+"/v2/beta/app/blobs/"+d.String(), tok, nil); resp.StatusCode != 404 {
		t.Fatalf("another project's blob was mounted: %s", resp.Status)
	}
	// Within one's own project, a mount works.
	tok = e.bearer(t, a, "repository:alpha/other:pull,push&scope=repository:alpha/secret:pull")
	resp, _ = do(t, "POST", e.srv.URL+"/v2/alpha/other/blobs/uploads/?mount="+d.String()+"&from=alpha/secret", tok, nil)
	if resp.StatusCode != 201 {
		t.Fatalf("mount within the project: %s, want 201", resp.Status)
	}
}

func TestPushesRecordReleasesAndReservedTagsAreImmutable(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, blobs.S3Config{})
	ci, ciID := e.tokenID(t, "shop", "web", identity.ScopeServiceDeploy)
	other := e.token(t, "shop", "", identity.ScopeServicesWrite)
	img1, _ := random.Image(256, 2)
	img2, _ := random.Image(256, 2)
	d1, _ := img1.Digest()
	d2, _ := img2.Digest()

	// A movable tag follows pushes and remembers where it was.
	for _, img := range []v1.Image{img1, img2, img2} {
		if err := remote.Write(e.ref(t, "shop/web:main"), img, auth(ci)); err != nil {
			t.Fatal(err)
		}
	}
	rel, err := e.rel.Get(ctx, "shop/web", "main")
	if err != nil {
		t.Fatal(err)
	}
	if rel.Digest != d2.String() || len(rel.History) != 1 || rel.History[0].Digest != d1.String() || rel.PushedBy != ciID {
		t.Fatalf("release of main: %+v", rel)
	}
	if len(rel.LogOutbox) == 0 {
		t.Fatal("a recorded push carries no change-log entry in its write")
	}

	// Reserved tags: once, never latest, pushed only by the reserver, once.
	if _, err := e.rel.Reserve(ctx, "shop/web", "v1.2.3", ciID, "machine"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rel.Reserve(ctx, "shop/web", "v1.2.3", "tok_other", "machine"); !errors.Is(err, registry.ErrTagReserved) {
		t.Fatalf("second reservation: %v", err)
	}
	if _, err := e.rel.Reserve(ctx, "shop/web", "main", ciID, "machine"); !errors.Is(err, registry.ErrTagReserved) {
		t.Fatalf("reserving a pushed tag: %v", err)
	}
	if _, err := e.rel.Reserve(ctx, "shop/web", "latest", ciID, "machine"); !errors.Is(err, registry.ErrTagInvalid) {
		t.Fatalf("reserving latest: %v", err)
	}
	if err := remote.Write(e.ref(t, "shop/web:v1.2.3"), img1, auth(other)); code(err) != "DENIED" {
		t.Fatalf("push to a tag reserved by another actor: %v", err)
	}
	if err := remote.Write(e.ref(t, "shop/web:v1.2.3"), img1, auth(ci)); err != nil {
		t.Fatalf("push by the reserver: %v", err)
	}
	if err := remote.Write(e.ref(t, "shop/web:v1.2.3"), img1, auth(ci)); err != nil {
		t.Fatalf("the same push again: %v", err)
	}
	if err := remote.Write(e.ref(t, "shop/web:v1.2.3"), img2, auth(ci)); code(err) != "DENIED" {
		t.Fatalf("moving a pushed release: %v", err)
	}
	got, err := remote.Image(e.ref(t, "shop/web:v1.2.3"), auth(ci))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := got.Digest(); d != d1 {
		t.Fatalf("the release serves %s, want %s", d, d1)
	}
}
