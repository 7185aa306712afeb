package registry_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
)

// TestConcurrentTagPushesAgreeWithTheRelease: rounds of 8 pushers PUT different manifests
// (their blobs already uploaded) to one tag at once. Every PUT is answered 201 (a push that
// lost the race stored its manifest all the same; none is 503), and after each round the
// tag's manifest as GET answers it is the digest the release record names, one of the
// round's manifests.
func TestConcurrentTagPushesAgreeWithTheRelease(t *testing.T) {
	const pushers, rounds = 8, 5
	e := newEnv(t, blobs.S3Config{})
	ci := e.token(t, "shop", "web", identity.ScopeServiceDeploy)
	type manifest struct {
		raw    []byte
		mt     string
		digest string
	}
	ms := make([][]manifest, rounds)
	for r := range ms {
		ms[r] = make([]manifest, pushers)
		for i := range ms[r] {
			img, err := random.Image(64, 1)
			if err != nil {
				t.Fatal(err)
			}
			d, _ := img.Digest()
			// The blobs (and the manifest, by digest) are uploaded first, so that the
			// pushers race on the tag alone.
			if err := remote.Write(e.ref(t, "shop/web@"+d.String()), img, auth(ci)); err != nil {
				t.Fatalf("upload image %d/%d: %v", r, i, err)
			}
			raw, _ := img.RawManifest()
			mt, _ := img.MediaType()
			ms[r][i] = manifest{raw: raw, mt: string(mt), digest: d.String()}
		}
	}
	tok := e.bearer(t, ci, "repository:shop/web:pull,push")
	url := e.srv.URL + "/v2/shop/web/manifests/main"
	for r := range rounds {
		start := make(chan struct{})
		answers := make([]string, pushers)
		var wg sync.WaitGroup
		for i := range pushers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, url, strings.NewReader(string(ms[r][i].raw)))
				req.Header.Set("Authorization", "Bearer "+tok)
				req.Header.Set("Content-Type", ms[r][i].mt)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					answers[i] = err.Error()
					return
				}
				resp.Body.Close()
				answers[i] = fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Docker-Content-Digest"))
				if resp.StatusCode != http.StatusCreated || resp.Header.Get("Docker-Content-Digest") != ms[r][i].digest {
					answers[i] = "unexpected " + answers[i]
				}
			}()
		}
		close(start)
		wg.Wait()
		for i, a := range answers {
			if strings.HasPrefix(a, "unexpected") || !strings.HasPrefix(a, "201 ") {
				t.Errorf("round %d: pusher %d was answered %s; want 201 with its digest", r, i, a)
			}
		}
		resp, _ := do(t, http.MethodGet, url, tok, nil, "Accept", ms[r][0].mt)
		tagged := resp.Header.Get("Docker-Content-Digest")
		rel, err := e.rel.Get(context.Background(), "shop/web", "main")
		if err != nil {
			t.Fatalf("round %d: release record: %v", r, err)
		}
		if resp.StatusCode != http.StatusOK || tagged != rel.Digest {
			t.Fatalf("round %d: GET shop/web:main is %s %s; the release record names %s", r, resp.Status, tagged, rel.Digest)
		}
		ours := false
		for _, m := range ms[r] {
			ours = ours || m.digest == rel.Digest
		}
		if !ours {
			t.Fatalf("round %d: the tag names %s, none of the round's manifests", r, rel.Digest)
		}
	}
}
