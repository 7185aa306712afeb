package api

import (
	"fmt"
	"strings"
	"testing"
)

func TestReserveReleaseTag(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if code, out := f.json("PUT", "/api/v1/projects/shop", map[string]any{}); code/100 != 2 {
		t.Fatalf("project: %d %v", code, out)
	}
	path := "/api/v1/projects/shop/services/web/releases"
	code, out := f.json("POST", path, map[string]any{"tag": "v1.2.3"})
	if code != 201 || out["tag"] != "v1.2.3" || out["repository"] != "shop/web" || out["reserved_by"] == "" {
		t.Fatalf("reserve: %d %v", code, out)
	}
	if code, out := f.json("POST", path, map[string]any{"tag": "v1.2.3"}); code != 409 || out["code"] != "release_tag_reserved" {
		t.Fatalf("reserve again: %d %v", code, out)
	}
	for _, bad := range []string{"latest", "", "-x", "a/b"} {
		if code, out := f.json("POST", path, map[string]any{"tag": bad}); code != 422 || out["code"] != "release_tag_invalid" {
			t.Errorf("tag %q: %d %v", bad, code, out)
		}
	}
	code, out = f.json("GET", path, nil)
	items, _ := out["items"].([]any)
	if code != 200 || len(items) != 1 {
		t.Fatalf("list: %d %v", code, out)
	}
	if code, out := f.json("POST", "/api/v1/projects/nope/services/web/releases", map[string]any{"tag": "v1"}); code != 404 {
		t.Fatalf("unknown project: %d %v", code, out)
	}

	// A pushed tag lists the follow its push left (no worker runs here: it stays pending); the
	// reservation, never pushed, has none.
	d := "sha256:" + strings.Repeat("3c", 32)
	f.recordPush("shop/web", "main", d)
	_, out = f.json("GET", path, nil)
	items, _ = out["items"].([]any)
	follows := map[string]any{}
	for _, it := range items {
		r, _ := it.(map[string]any)
		follows[fmt.Sprint(r["tag"])] = r["follow"]
	}
	main, _ := follows["main"].(map[string]any)
	if len(items) != 2 || main["state"] != "pending" || main["digest"] != d || follows["v1.2.3"] != nil {
		t.Fatalf("list after a push: %v", out)
	}
}
