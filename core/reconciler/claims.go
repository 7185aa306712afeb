package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"
	"strings"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
)

// claimsFor maps each route claim to the id of the service in svcs that
// holds it (docs/routes.md section 2); a claim whose service is not in svcs
// is left out, so it counts as no claim.
func (r *Reconciler) claimsFor(ctx context.Context, svcs []services.Service) (routes.Claims, error) {
	cls, err := r.cfg.Catalog.ListRouteClaims(ctx)
	if err != nil {
		return nil, err
	}
	byName := make(map[[2]string]string, len(svcs))
	for _, s := range svcs {
		if !s.Deleting {
			byName[[2]string{s.ProjectID, s.Name}] = s.ID
		}
	}
	out := routes.Claims{}
	for _, c := range cls {
		if id, ok := byName[[2]string{c.ProjectID, c.Service}]; ok {
			out[c.Hostname] = id
		}
	}
	return out, nil
}

// logClaims logs each exclusion and each withheld declaration once, when it
// appears or its reason changes, and once when it ends; a pass that decides
// the same as the last one logs nothing. Called by route only (one pass at a
// time), so claimLog needs no lock.
func (r *Reconciler) logClaims(res routes.Resolution) {
	now := map[string]string{}
	for _, e := range res.Excluded {
		now["excluded\x00"+e.Hostname] = e.Reason
	}
	for _, w := range res.Withheld {
		now["withheld\x00"+w.Hostname+"\x00"+w.Project+"/"+w.Service] = w.Owner
	}
	keys := make([]string, 0, len(now)+len(r.claimLog))
	for k := range now {
		keys = append(keys, k)
	}
	for k := range r.claimLog {
		if _, ok := now[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		was, had := r.claimLog[k]
		v, has := now[k]
		if had && has && was == v {
			continue
		}
		var svc string
		parts := strings.Split(k, "\x00")
		kind, host := parts[0], parts[1]
		if len(parts) > 2 {
			svc = parts[2]
		}
		switch {
		case kind == "excluded" && has:
			r.log.Warn("hostname served by no service: several declare it and none holds its claim", "hostname", host, "reason", v)
		case kind == "excluded":
			r.log.Info("hostname no longer excluded by claims", "hostname", host)
		case has:
			r.log.Warn("hostname withheld from a service: another holds its claim", "hostname", host, "service", svc, "served_for", v)
		default:
			r.log.Info("hostname no longer withheld from a service", "hostname", host, "service", svc)
		}
	}
	r.claimLog = now
}

// tableDigest is the digest the reconciler compares tables by: the routes'
// (abiroutes.Table.Digest) and the exclusions, so a change of exclusions
// alone publishes a new table and `berth routes` shows it.
func tableDigest(t abiroutes.Table) string {
	if len(t.Excluded) == 0 {
		return t.Digest()
	}
	raw, _ := json.Marshal(t.Excluded) // plain strings: cannot fail
	sum := sha256.Sum256(append([]byte(t.Digest()+"\x00"), raw...))
	return hex.EncodeToString(sum[:])
}
