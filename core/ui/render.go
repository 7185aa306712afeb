package ui

import (
	"bytes"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// pageNames are the page templates under templates/, each parsed with layout.html. A page
// template defines "main" (the page's body) and, for a page with a live region, "live".
var pageNames = []string{"login", "error", "overview", "services", "service", "nodes", "undo", "workloads", "workload", "node", "operations", "changelog", "domains", "registry", "secrets", "access", "plugins", "jobs", "deploy", "backups", "restore", "promote", "newtoken", "token", "newuser", "confirm"}

// parsePages parses every page with the layout and the shared helpers.
func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"ago":          ago,
		"short":        shortDigest,
		"digestOf":     currentDigest,
		"upper":        strings.ToUpper,
		"svcURL":       serviceURL,
		"wlURL":        workloadURL,
		"nodeURL":      nodeURL,
		"logTime":      logTime,
		"logURL":       logStreamURL,
		"changelogURL": changelogURL,
		"list":         func(s ...string) []string { return s },
		"mib":          mib,
		"bytes":        byteSize,
		"restoreURL":   restoreURL,
		"promoteURL":   promoteURL,
		"percent":      percent,
		"specRev":      specRevisionField,
		"stateCSS":     stateClass,
		"time":         func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	}
	out := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(embedded, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			panic("ui: template " + name + ": " + err.Error())
		}
		out[name] = t
	}
	return out
}

// maxPooledBuffer is the largest render buffer [Handler.bufs] keeps for the next page.
const maxPooledBuffer = 1 << 20

// getBuffer returns an empty render buffer from the handler's pool, so a page costs no growth
// of a fresh buffer.
func (h *Handler) getBuffer() *bytes.Buffer {
	if b, ok := h.bufs.Get().(*bytes.Buffer); ok {
		return b
	}
	return new(bytes.Buffer)
}

// putBuffer returns b to the pool unless it grew beyond maxPooledBuffer.
func (h *Handler) putBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuffer {
		b.Reset()
		h.bufs.Put(b)
	}
}

// render writes page name with data, buffered so a template error never sends half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, code int, name string, data any) {
	buf := h.getBuffer()
	defer h.putBuffer(buf)
	if err := h.pages[name].ExecuteTemplate(buf, "layout", data); err != nil {
		h.log.Error("render a dashboard page", "page", name, "err", err)
		http.Error(w, "the page could not be rendered; the server log says why", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// renderLive renders page name's live region with data.
func (h *Handler) renderLive(name string, data any) ([]byte, error) {
	var buf bytes.Buffer
	err := h.pages[name].ExecuteTemplate(&buf, "live", data)
	return buf.Bytes(), err
}

// renderError shows msg on the error page with status code.
func (h *Handler) renderError(w http.ResponseWriter, r *http.Request, code int, msg string) {
	h.render(w, r, code, "error", &pageData{Title: http.StatusText(code), Notice: msg, Viewer: nil})
}

// apiError shows what the API refused: its status and its own words (problem details carry
// no secret; internal details stay in the API's log), or a generic unavailability.
func (h *Handler) apiError(w http.ResponseWriter, r *http.Request, err error) {
	var apiErr *client.APIError
	if errors.As(err, &apiErr) {
		if apiErr.Status == http.StatusUnauthorized && apiErr.Problem.Code == "unauthenticated" {
			h.toLogin(w, r)
			return
		}
		msg := apiErr.Problem.Detail
		if msg == "" {
			msg = apiErr.Problem.Title
		}
		if apiErr.Problem.Code != "" {
			msg += " (" + apiErr.Problem.Code + ")"
		}
		h.renderError(w, r, apiErr.Status, msg)
		return
	}
	h.log.Warn("dashboard: an API call failed", "path", r.URL.Path, "err", err)
	h.renderError(w, r, http.StatusServiceUnavailable, "The API did not answer. Try again shortly.")
}

// ago is how long before now t was, in one unit ("3m ago"); "never" for the zero time.
func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h ago"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d ago"
}

// shortDigest shortens "sha256:abcdef..." to "sha256:abcdef012345"; other strings are kept.
func shortDigest(s string) string {
	if i := strings.Index(s, "sha256:"); i >= 0 && len(s) > i+7+12 {
		return s[:i+7+12]
	}
	return s
}

// stateClass is the CSS class of a verdict or status.
func stateClass(state string) string {
	switch state {
	case "refused", "crashed", "failed", "timed_out", "disconnected", "quarantined", "unhealthy", "deny", "error", "missed":
		return "bad"
	case "waiting", "converging", "draining", "pending", "starting", "queued", "leased", "retry", "expiring", "renewing", "restarting":
		return "warn"
	case "converged", "connected", "running", "succeeded", "issued", "followed", "healthy", "allow", "passed", "ready", "written":
		return "ok"
	}
	return "none"
}

// serviceURL is the dashboard page of a service.
func serviceURL(project, name string) string {
	return "/ui/services/" + url.PathEscape(project) + "/" + url.PathEscape(name)
}

func parseRevision(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0
}

// byteSize shows a size in bytes in the largest binary unit that keeps it at least 1.
func byteSize(b int64) string {
	const unit = 1024
	if b < unit {
		return strconv.FormatInt(b, 10) + " B"
	}
	f, i := float64(b), 0
	for f >= unit && i < 4 {
		f /= unit
		i++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + []string{"B", "KiB", "MiB", "GiB", "TiB"}[i]
}

// restoreURL is the restore page of backup id in project.
func restoreURL(project, id string) string {
	return "/ui/backups/" + url.PathEscape(project) + "/" + url.PathEscape(id) + "/restore"
}
