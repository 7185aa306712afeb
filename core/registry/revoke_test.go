package registry_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
)

// bearerFor asks the token endpoint for a registry bearer of cred over scope.
func (e *env) bearerFor(t *testing.T, cred, scope string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/v2/token?service=berth&scope="+url.QueryEscape(scope), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("berth", cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("token for %s: %d %s", scope, resp.StatusCode, b)
	}
	var out struct {
		Token string `json:"token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Token
}

// withBearer makes one registry request with a registry bearer and returns
// its status, its first registry error code ("" for none) and its
// WWW-Authenticate header.
func (e *env) withBearer(t *testing.T, method, path, bearer string) (status int, code, challenge string) {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Errors []struct {
			Code string `json:"code"`
		} `json:"errors"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if json.Unmarshal(raw, &body) == nil && len(body.Errors) > 0 {
		code = body.Errors[0].Code
	}
	return resp.StatusCode, code, resp.Header.Get("WWW-Authenticate")
}

// TestRevokedCredentialStopsItsBearers: a registry bearer lasts 5 minutes,
// but it stands for the Berth credential it was issued to only while that
// credential is good. Once a machine token is revoked, a human's sessions
// are revoked, or a node is removed, the very next pull or push with a
// bearer it already holds is refused 401 UNAUTHORIZED with a new challenge,
// while the bearers of other credentials keep working; a session whose roles
// lost push is challenged on a push and still pulls. Before, a revoked
// token's bearer kept pulling and pushing until it expired.
func TestRevokedCredentialStopsItsBearers(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, blobs.S3Config{})
	scopes := []identity.Scope{identity.ScopeServicesRead, identity.ScopeServiceDeploy}
	revoked, revokedID := e.tokenID(t, "shop", "", scopes...)
	kept := e.token(t, "shop", "", scopes...)

	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(e.ref(t, "shop/web:v1"), img, auth(revoked)); err != nil {
		t.Fatalf("push with the token: %v", err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	const scope = "repository:shop/web:pull,push"
	manifest := "/v2/shop/web/manifests/v1"
	upload := "/v2/shop/web/blobs/uploads/"
	bRevoked, bKept := e.bearerFor(t, revoked, scope), e.bearerFor(t, kept, scope)
	for _, b := range []string{bRevoked, bKept} {
		if st, c, _ := e.withBearer(t, http.MethodGet, manifest, b); st != http.StatusOK {
			t.Fatalf("pull before revocation: %d %s", st, c)
		}
	}

	if err := e.tokens.Revoke(ctx, revokedID); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ method, path string }{{http.MethodGet, manifest}, {http.MethodHead, manifest}, {http.MethodPost, upload}, {http.MethodGet, "/v2/"}} {
		st, c, ch := e.withBearer(t, r.method, r.path, bRevoked)
		if st != http.StatusUnauthorized || !strings.HasPrefix(ch, "Bearer realm=") {
			t.Errorf("%s %s with the revoked token's bearer: %d %q (challenge %q), want 401 with a challenge", r.method, r.path, st, c, ch)
		}
		if r.method != http.MethodHead && c != "UNAUTHORIZED" {
			t.Errorf("%s %s with the revoked token's bearer: code %q, want UNAUTHORIZED", r.method, r.path, c)
		}
	}
	if _, err := remote.Image(e.ref(t, "shop/web@"+d.String()), auth(revoked)); code(err) != "UNAUTHORIZED" {
		t.Errorf("pull with the revoked token itself: %v, want UNAUTHORIZED", err)
	}
	if st, c, _ := e.withBearer(t, http.MethodGet, manifest, bKept); st != http.StatusOK {
		t.Errorf("pull with the other token's bearer: %d %s", st, c)
	}
	if st, c, _ := e.withBearer(t, http.MethodPost, upload, bKept); st != http.StatusAccepted {
		t.Errorf("push with the other token's bearer: %d %s", st, c)
	}

	t.Run("session", func(t *testing.T) {
		const pw = "a password long enough for the policy"
		if _, err := e.tokens.CreateUser(ctx, identity.NewUserRequest{Name: "ann", Kind: identity.KindHuman, Roles: []identity.Role{identity.RoleAdmin}, Password: pw}); err != nil {
			t.Fatal(err)
		}
		s1, err := e.tokens.Login(ctx, "ann", pw, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := e.bearerFor(t, s1.Token, scope)
		if st, c, _ := e.withBearer(t, http.MethodGet, manifest, b); st != http.StatusOK {
			t.Fatalf("pull with the session's bearer: %d %s", st, c)
		}
		if _, err := e.tokens.ChangeCredential(ctx, "ann", s1.Generation, identity.OpRevokeSessions, ""); err != nil {
			t.Fatal(err)
		}
		if st, c, _ := e.withBearer(t, http.MethodGet, manifest, b); st != http.StatusUnauthorized || c != "UNAUTHORIZED" {
			t.Errorf("pull with a revoked session's bearer: %d %q, want 401 UNAUTHORIZED", st, c)
		}
		s2, err := e.tokens.Login(ctx, "ann", pw, 0)
		if err != nil {
			t.Fatal(err)
		}
		b2 := e.bearerFor(t, s2.Token, scope)
		if st, c, _ := e.withBearer(t, http.MethodGet, manifest, b2); st != http.StatusOK {
			t.Errorf("pull with a new session's bearer: %d %s", st, c)
		}
		// Roles lowered to viewer: the bearer granted push is challenged on a push, and still pulls.
		if _, err := e.tokens.SetRoles(ctx, "ann", []identity.Role{identity.RoleViewer}, nil); err != nil {
			t.Fatal(err)
		}
		if st, c, ch := e.withBearer(t, http.MethodPost, upload, b2); st != http.StatusUnauthorized || !strings.Contains(ch, "pull,push") {
			t.Errorf("push after the roles lost it: %d %q (challenge %q); want 401 with a challenge for push", st, c, ch)
		}
		if st, c, _ := e.withBearer(t, http.MethodGet, manifest, b2); st != http.StatusOK {
			t.Errorf("pull as a viewer: %d %s", st, c)
		}
	})

	t.Run("node", func(t *testing.T) {
		join, _, err := e.nodes.CreateJoinToken(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		enroll := func() (*nodes.Node, string) {
			n, cred, err := e.nodes.Enroll(ctx, nodes.EnrollRequest{JoinToken: join, PublicKey: base64.StdEncoding.EncodeToString(pub), Hostname: "n"})
			if err != nil {
				t.Fatal(err)
			}
			return n, cred
		}
		gone, goneCred := enroll()
		join, _, err = e.nodes.CreateJoinToken(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		stays, staysCred := enroll()
		e.mu.Lock()
		e.images[gone.ID] = []string{e.host + "/shop/web@" + d.String()}
		e.images[stays.ID] = []string{e.host + "/shop/web@" + d.String()}
		e.mu.Unlock()
		byDigest := "/v2/shop/web/manifests/" + d.String()
		bGone, bStays := e.bearerFor(t, goneCred, "repository:shop/web:pull"), e.bearerFor(t, staysCred, "repository:shop/web:pull")
		for _, b := range []string{bGone, bStays} {
			if st, c, _ := e.withBearer(t, http.MethodGet, byDigest, b); st != http.StatusOK {
				t.Fatalf("node pull before removal: %d %s", st, c)
			}
		}
		if _, _, err := e.nodes.Remove(ctx, gone.ID); err != nil {
			t.Fatal(err)
		}
		if st, c, _ := e.withBearer(t, http.MethodGet, byDigest, bGone); st != http.StatusUnauthorized || c != "UNAUTHORIZED" {
			t.Errorf("pull with a removed node's bearer: %d %q, want 401 UNAUTHORIZED", st, c)
		}
		if st, c, _ := e.withBearer(t, http.MethodGet, byDigest, bStays); st != http.StatusOK {
			t.Errorf("pull with the other node's bearer: %d %s", st, c)
		}
	})
}
