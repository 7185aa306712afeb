package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// PushBundle uploads a release bundle, the raw tar.gz read from r, to project
// (POST /projects/{project}/bundles?name=NAME, Content-Type application/gzip)
// and returns the stored bundle with the digest the server computed. name is
// optional; with one, service specs can refer to the bundle by name.
//
// r is streamed, never buffered whole. When r reports its remaining length (a
// Len() int method, as *bytes.Reader has) or is a regular *os.File, the
// request carries a Content-Length; otherwise it is sent chunked. The client
// does not close r.
func (c *Client) PushBundle(ctx context.Context, project, name string, r io.Reader) (*Bundle, error) {
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
	}
	var out Bundle
	if err := c.do(ctx, http.MethodPost, "/projects/"+pathEscape(project)+"/bundles", q, r, "application/gzip", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DownloadBundle streams the bundle with digest ("sha256:<hex>") into w
// (GET /bundles/{digest}). Nodes call it with their node credential as the
// client's token. It does not check the digest of what it wrote: the caller
// does, for example while extracting. A missing bundle fails with code
// "bundle_not_found".
func (c *Client) DownloadBundle(ctx context.Context, digest string, w io.Writer) error {
	resp, err := c.send(ctx, http.MethodGet, "/bundles/"+pathEscape(digest), nil, nil, "", "application/gzip", true)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("download bundle %s: %w", digest, err)
	}
	return nil
}

// ListBundles lists a project's bundles, newest first (GET /projects/{project}/bundles).
func (c *Client) ListBundles(ctx context.Context, project string) ([]Bundle, error) {
	var out List[Bundle]
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/bundles", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}
