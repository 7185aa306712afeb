package registry_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// TestMalformedManifestsAreRefused: manifests that are not a manifest (null, an array, schema
// version 3), name a malformed digest, or give a negative size or one that differs from the
// stored blob's are answered 400 with the registry's error code in its error body (not 503,
// which a client retries), and leave no tag, manifest or release behind. The well-formed
// manifest they were made from is then accepted.
func TestMalformedManifestsAreRefused(t *testing.T) {
	e := newEnv(t, blobs.S3Config{})
	ci := e.token(t, "shop", "web", identity.ScopeServiceDeploy)
	img, err := random.Image(128, 2)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	if err := remote.Write(e.ref(t, "shop/web@"+d.String()), img, auth(ci)); err != nil {
		t.Fatal(err)
	}
	good, _ := img.RawManifest()
	mt, _ := img.MediaType()
	tok := e.bearer(t, ci, "repository:shop/web:pull,push")
	// edit returns the good manifest with one change made to its decoded form.
	edit := func(change func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		change(m)
		b, _ := json.Marshal(m)
		return b
	}
	layer := func(m map[string]any, i int) map[string]any { return m["layers"].([]any)[i].(map[string]any) }
	config := func(m map[string]any) map[string]any { return m["config"].(map[string]any) }
	const ociManifest, ociIndex = "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"
	index := func(size int64, dg string) []byte {
		b, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": ociIndex,
			"manifests": []map[string]any{{"mediaType": string(mt), "digest": dg, "size": size}}})
		return b
	}
	for _, tc := range []struct {
		name, ctype string
		body        []byte
		code        string
	}{
		{"null", ociManifest, []byte("null"), "MANIFEST_INVALID"},
		{"an array", ociManifest, []byte("[]"), "MANIFEST_INVALID"},
		{"a string", string(mt), []byte(`"manifest"`), "MANIFEST_INVALID"},
		{"schema version 3", string(mt), edit(func(m map[string]any) { m["schemaVersion"] = 3 }), "MANIFEST_INVALID"},
		{"no schema version", string(mt), edit(func(m map[string]any) { delete(m, "schemaVersion") }), "MANIFEST_INVALID"},
		{"no config", string(mt), edit(func(m map[string]any) { delete(m, "config") }), "MANIFEST_INVALID"},
		{"a layer digest that is not one", string(mt), edit(func(m map[string]any) { layer(m, 0)["digest"] = "sha256:xyz" }), "DIGEST_INVALID"},
		{"a layer digest of no algorithm", string(mt), edit(func(m map[string]any) { layer(m, 1)["digest"] = "not-a-digest" }), "DIGEST_INVALID"},
		{"a config digest in upper case", string(mt), edit(func(m map[string]any) {
			config(m)["digest"] = "sha256:" + hex.EncodeToString(make([]byte, 30)) + "ABCD"
		}), "DIGEST_INVALID"},
		{"a negative layer size", string(mt), edit(func(m map[string]any) { layer(m, 0)["size"] = -1 }), "SIZE_INVALID"},
		{"a wrong layer size", string(mt), edit(func(m map[string]any) { layer(m, 1)["size"] = layer(m, 1)["size"].(float64) + 1 }), "SIZE_INVALID"},
		{"a wrong config size", string(mt), edit(func(m map[string]any) { config(m)["size"] = 1 }), "SIZE_INVALID"},
		{"an index naming a malformed digest", ociIndex, index(int64(len(good)), "sha256:1234"), "DIGEST_INVALID"},
		{"an index with a negative size", ociIndex, index(-5, d.String()), "SIZE_INVALID"},
		{"an index with a wrong size", ociIndex, index(int64(len(good))+7, d.String()), "SIZE_INVALID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(t, http.MethodPut, e.srv.URL+"/v2/shop/web/manifests/bad", tok, tc.body, "Content-Type", tc.ctype)
			if resp.StatusCode != http.StatusBadRequest || errCode(b) != tc.code {
				t.Fatalf("PUT %s: %s %s; want 400 %s", tc.name, resp.Status, b, tc.code)
			}
			var shape struct {
				Errors []struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"errors"`
			}
			if json.Unmarshal(b, &shape) != nil || len(shape.Errors) != 1 || shape.Errors[0].Message == "" {
				t.Fatalf("PUT %s: the error body is not the registry's {errors: [{code, message}]}: %s", tc.name, b)
			}
			if resp, _ := do(t, http.MethodGet, e.srv.URL+"/v2/shop/web/manifests/bad", tok, nil, "Accept", tc.ctype); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("PUT %s: the refused tag answers %s", tc.name, resp.Status)
			}
			sum := sha256.Sum256(tc.body)
			if resp, _ := do(t, http.MethodHead, e.srv.URL+"/v2/shop/web/manifests/sha256:"+hex.EncodeToString(sum[:]), tok, nil, "Accept", tc.ctype); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("PUT %s: the refused manifest is stored: HEAD answers %s", tc.name, resp.Status)
			}
			if _, err := e.rel.Get(context.Background(), "shop/web", "bad"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("PUT %s: a release was recorded (%v)", tc.name, err)
			}
		})
	}
	if resp, b := do(t, http.MethodPut, e.srv.URL+"/v2/shop/web/manifests/bad", tok, good, "Content-Type", string(mt)); resp.StatusCode != http.StatusCreated {
		t.Fatalf("the well-formed manifest: %s %s", resp.Status, b)
	}
	if resp, b := do(t, http.MethodPut, e.srv.URL+"/v2/shop/web/manifests/list", tok, index(int64(len(good)), d.String()), "Content-Type", ociIndex); resp.StatusCode != http.StatusCreated {
		t.Fatalf("a well-formed index: %s %s", resp.Status, b)
	}
}
