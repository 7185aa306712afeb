package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/releases"
)

// JoinCommand is the one line that sets up a host with join code code
// (docs/joining.md section 3): the setup script fetched over a connection
// pinned to berthd's public key, run by sh. Without a pin it trusts the
// system CAs.
func JoinCommand(publicURL, pin, code string) string {
	url := publicURL + "/join/" + code + "/setup.sh"
	if pin == "" {
		return fmt.Sprintf("curl -sS '%s' | sh", url)
	}
	return fmt.Sprintf("curl -sS --insecure --pinnedpubkey '%s' '%s' | sh", pin, url)
}

// createJoinCode serves POST /nodes/join-codes (docs/joining.md section 1): a
// join code with optional labels and lifetime, and the command that uses it.
func (s *Server) createJoinCode(c echo.Context) error {
	var req struct {
		TTLSeconds int               `json:"ttl_seconds"`
		Labels     map[string]string `json:"labels"`
	}
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if req.TTLSeconds < 0 || ttl > nodes.MaxJoinCodeTTL {
		return problem(abierrors.ValidationFailed, fmt.Sprintf("ttl_seconds must be between 0 (30 min) and %d", int(nodes.MaxJoinCodeTTL.Seconds())))
	}
	if err := nodes.JoinCodeLabels(req.Labels); err != nil {
		return problem(abierrors.ValidationFailed, err.Error())
	}
	j, err := s.cfg.Nodes.CreateJoin(c.Request().Context(), nodes.JoinRequest{Code: true, TTL: ttl, Labels: req.Labels})
	if err != nil {
		return err
	}
	s.log.Info("join code created", "node_id", j.NodeID, "expires_at", j.ExpiresAt, "labels", req.Labels)
	return c.JSON(http.StatusCreated, map[string]any{
		"code":         j.Secret,
		"node_id":      j.NodeID,
		"join_command": JoinCommand(s.cfg.PublicURL, s.cfg.PublicKeyPin, j.Secret),
		"setup_url":    s.cfg.PublicURL + "/join/" + j.Secret + "/setup.sh",
		"expires_at":   j.ExpiresAt,
	})
}

// joinSetup serves GET /join/{code}/setup.sh: the setup script of a usable
// code, or 404 with one message (as a script that exits 1) for a code that is
// unknown, expired or used.
func (s *Server) joinSetup(c echo.Context) error {
	code := c.Param("code")
	h := c.Response().Header()
	h.Set("Cache-Control", "no-store")
	if err := s.cfg.Nodes.CheckJoinCode(c.Request().Context(), code); errors.Is(err, nodes.ErrJoinCodeInvalid) {
		return c.Blob(http.StatusNotFound, "text/x-shellscript; charset=utf-8", []byte(nodes.InvalidJoinScript))
	} else if err != nil {
		return err
	}
	sums := map[string]string{}
	for _, p := range []string{"berth-agent", "berth-plugin-process"} {
		for _, a := range []string{"amd64", "arm64"} {
			name := releases.DownloadName(p, a)
			if f, rel, err := s.cfg.Releases.Download(name); err == nil {
				_ = f.Close()
				sums[name] = rel.SHA256
			}
		}
	}
	script, err := nodes.SetupScript{Server: s.cfg.PublicURL, PublicKeyPin: s.cfg.PublicKeyPin, Fingerprint: s.cfg.ServerFingerprint, Code: code, Sums: sums}.Render()
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, "text/x-shellscript; charset=utf-8", script)
}

// download serves GET /downloads/{name}: a binary of the release berthd was
// shipped with (releases.Catalog.Download), or SHA256SUMS listing them all.
// Public: what it serves is public anyway.
func (s *Server) download(c echo.Context) error {
	name := c.Param("name")
	if name == "SHA256SUMS" {
		sums, err := s.cfg.Releases.Sums()
		if err != nil {
			return err
		}
		return c.Blob(http.StatusOK, "text/plain; charset=utf-8", sums)
	}
	f, rel, err := s.cfg.Releases.Download(name)
	if errors.Is(err, releases.ErrNotFound) {
		return problem(abierrors.NotFound, "no download "+name+": berthd offers berth-agent and its plugins as <program>-linux-<amd64|arm64>")
	} else if err != nil {
		return err
	}
	defer f.Close()
	h := c.Response().Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(rel.Size, 10))
	http.ServeContent(c.Response(), c.Request(), "", time.Time{}, f)
	return nil
}
