package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/storage"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/distribution/v3/registry/storage/driver/factory"
	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// Retention defaults (docs/registry.md section 10).
const (
	DefaultKeepReleases  = 3
	DefaultReleaseMinAge = 7 * 24 * time.Hour
	DefaultManifestGrace = 24 * time.Hour
	DefaultBlobGrace     = 24 * time.Hour
	DefaultMinUptime     = time.Hour
	DefaultMaxDeletions  = 20_000
)

// GCPolicy is the registry's retention (docs/registry.md section 10). Zero
// fields take the defaults above; negative durations mean zero.
type GCPolicy struct {
	// KeepReleases is how many of a repository's newest pushed releases
	// keep their tags whatever their age.
	KeepReleases int
	// ReleaseMinAge: a release pushed more recently keeps its tag.
	ReleaseMinAge time.Duration
	// ManifestGrace: a manifest written or used more recently is kept.
	ManifestGrace time.Duration
	// BlobGrace: a blob written or used more recently is kept.
	BlobGrace time.Duration
	// MinUptime: no blob is deleted before the registry has served this long.
	MinUptime time.Duration
	// MaxDeletions bounds the deletions of one pass; the rest waits for the
	// next pass (the report says so with Remaining).
	MaxDeletions int
}

func (p GCPolicy) withDefaults() GCPolicy {
	if p.KeepReleases <= 0 {
		p.KeepReleases = DefaultKeepReleases
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		} else if *d < 0 {
			*d = 0
		}
	}
	def(&p.ReleaseMinAge, DefaultReleaseMinAge)
	def(&p.ManifestGrace, DefaultManifestGrace)
	def(&p.BlobGrace, DefaultBlobGrace)
	def(&p.MinUptime, DefaultMinUptime)
	if p.MaxDeletions <= 0 {
		p.MaxDeletions = DefaultMaxDeletions
	}
	return p
}

// GCItem is one thing a pass deletes: a tag, a manifest of a repository, or
// a blob of the whole registry.
type GCItem struct {
	Kind       string `json:"kind"` // "tag", "manifest" or "blob"
	Repository string `json:"repository,omitempty"`
	Tag        string `json:"tag,omitempty"`
	Digest     string `json:"digest"`
	Size       int64  `json:"size,omitempty"` // bytes, blobs only
}

// GCReport is what one pass decided and did.
type GCReport struct {
	DryRun bool `json:"dry_run"`
	// MarkedAt is when the pass began marking; nothing written or used
	// after it is deleted by the pass.
	MarkedAt time.Time `json:"marked_at"`
	// Deletions lists what goes (dry run) or went, in that order: tags,
	// manifests, blobs.
	Deletions []GCItem `json:"deletions"`
	// KeptManifests counts manifests kept (per repository), KeptBlobs the
	// blobs something kept references.
	KeptManifests int `json:"kept_manifests"`
	KeptBlobs     int `json:"kept_blobs"`
	// BlobsSkipped says why no blob was judged this pass; empty when they were.
	BlobsSkipped string `json:"blobs_skipped,omitempty"`
	// Skipped names repositories that could not be read (and why); with
	// any, no blob is collected.
	Skipped []string `json:"skipped,omitempty"`
	// Failures are deletions that failed; the next pass tries again.
	Failures []string `json:"failures,omitempty"`
	// Remaining reports whether work was left for the next pass (the
	// deletion bound, failures, or blobs skipped for a repository).
	Remaining bool `json:"remaining"`
}

// GCKeep returns the image references ("[host/]<repo>@sha256:<hex>") that
// something outside the registry still needs: what services run and ran,
// what live operations name. The collector keeps them and all they reference.
type GCKeep func(ctx context.Context) ([]string, error)

// Collector is the registry's garbage collector: one mark and sweep pass
// over the storage the registry serves, judged by a [GCPolicy] against the
// releases and the references [GCKeep] returns. Safe for concurrent use; passes
// run one at a time.
type Collector struct {
	reg      *Registry
	releases *Releases
	keep     GCKeep
	policy   GCPolicy
	log      *slog.Logger

	mu sync.Mutex // one pass at a time
}

// NewCollector returns the collector of reg. releases and keep may be nil
// (no release keeps a tag beyond the policy's age and count; nothing else
// is kept).
func NewCollector(reg *Registry, releases *Releases, keep GCKeep, policy GCPolicy) *Collector {
	return &Collector{reg: reg, releases: releases, keep: keep, policy: policy.withDefaults(), log: reg.log}
}

// Collect runs one pass. With dryRun it deletes nothing and reports what a
// pass would delete now. Errors: the releases or the keep list could not be
// read, or the storage could not be listed at all (nothing is deleted then).
// A repository that cannot be read is reported in Skipped, and a deletion that
// fails in Failures; both leave Remaining set.
//
// Safety against concurrent pushes: the pass records MarkedAt first; a tag is
// removed only if it still names the digest judged, a manifest or blob only if
// it was neither written nor used (a registry request naming its digest) within
// its grace before MarkedAt, re-read right before it is deleted; layer links
// go only with their blob.
func (c *Collector) Collect(ctx context.Context, dryRun bool) (*GCReport, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.policy
	now := c.reg.cfg.Now()
	rep := &GCReport{DryRun: dryRun, MarkedAt: now, Deletions: []GCItem{}}
	ns, drv := c.reg.ns, c.reg.drv
	if ns == nil || drv == nil {
		return nil, errors.New("registry gc: the registry has no storage to collect")
	}

	// Roots: what something outside keeps, per repository.
	roots := map[string]map[digest.Digest]bool{}
	addRoot := func(repo string, d digest.Digest) {
		if roots[repo] == nil {
			roots[repo] = map[digest.Digest]bool{}
		}
		roots[repo][d] = true
	}
	if c.keep != nil {
		refs, err := c.keep(ctx)
		if err != nil {
			return nil, fmt.Errorf("registry gc: what is in use: %w", err)
		}
		for _, ref := range refs {
			if repo, d, ok := splitImageRef(ref); ok {
				addRoot(repo, d)
			}
		}
	}
	// Releases: which tags keep their digest.
	keptTag := map[string]bool{}    // "<repo>:<tag>" whose tag stays
	prunable := map[string]string{} // "<repo>:<tag>" -> digest the pass may untag
	if c.releases != nil {
		all, err := c.releases.All(ctx)
		if err != nil {
			return nil, fmt.Errorf("registry gc: %w", err)
		}
		byRepo := map[string][]Release{}
		for _, r := range all {
			if r.Digest != "" {
				byRepo[r.Repository] = append(byRepo[r.Repository], r)
			}
		}
		for repo, rs := range byRepo {
			sort.Slice(rs, func(i, j int) bool { return rs[i].PushedAt.After(rs[j].PushedAt) })
			for i, r := range rs {
				id := repo + ":" + r.Tag
				d, err := digest.Parse(r.Digest)
				if err != nil {
					keptTag[id] = true
					continue
				}
				if i < p.KeepReleases || now.Sub(r.PushedAt) < p.ReleaseMinAge || roots[repo][d] {
					keptTag[id] = true
					continue
				}
				prunable[id] = r.Digest
			}
		}
	}

	enum, ok := ns.(distribution.RepositoryEnumerator)
	if !ok {
		return nil, errors.New("registry gc: the storage cannot list repositories")
	}
	marked := map[digest.Digest]bool{} // every digest a kept manifest reaches, registry-wide
	type candidate struct {
		repo string
		d    digest.Digest
	}
	var manifestsToGo []candidate
	var tagsToGo []GCItem
	err := enum.Enumerate(ctx, func(repo string) error {
		if err := c.judgeRepository(ctx, repo, now, roots[repo], keptTag, prunable, marked, rep,
			func(tag string, d digest.Digest) {
				tagsToGo = append(tagsToGo, GCItem{Kind: "tag", Repository: repo, Tag: tag, Digest: d.String()})
			},
			func(d digest.Digest) { manifestsToGo = append(manifestsToGo, candidate{repo, d}) }); err != nil {
			rep.Skipped = append(rep.Skipped, repo+": "+err.Error())
		}
		return ctx.Err()
	})
	if err != nil && !isPathNotFound(err) {
		return nil, fmt.Errorf("registry gc: list repositories: %w", err)
	}
	rep.KeptBlobs = len(marked)

	budget := p.MaxDeletions
	take := func(it GCItem) bool {
		if budget <= 0 {
			rep.Remaining = true
			return false
		}
		budget--
		rep.Deletions = append(rep.Deletions, it)
		return true
	}
	for _, it := range tagsToGo {
		take(it)
	}
	for _, m := range manifestsToGo {
		take(GCItem{Kind: "manifest", Repository: m.repo, Digest: m.d.String()})
	}
	// Blobs: only when every repository was judged, no manifest waits, and
	// the registry has served long enough that no client holds a blob it
	// found before a restart.
	switch {
	case len(rep.Skipped) > 0:
		rep.BlobsSkipped = "some repositories could not be read"
		rep.Remaining = true
	case len(tagsToGo)+len(manifestsToGo) > 0:
		rep.BlobsSkipped = "tags and manifests go first; blobs they held are judged by the next pass"
		rep.Remaining = true
	case now.Sub(c.reg.started) < p.MinUptime:
		rep.BlobsSkipped = fmt.Sprintf("the registry has served for less than %s", p.MinUptime)
	default:
		err := ns.Blobs().Enumerate(ctx, func(d digest.Digest) error {
			if marked[d] {
				return nil
			}
			fi, err := drv.Stat(ctx, blobDataPath(d))
			if err != nil {
				if isPathNotFound(err) {
					return nil // an upload in progress or a blob just removed
				}
				rep.Failures = append(rep.Failures, "stat blob "+d.String()+": "+err.Error())
				return nil
			}
			if !c.reg.idle(d, fi.ModTime(), now, p.BlobGrace) {
				return nil
			}
			take(GCItem{Kind: "blob", Digest: d.String(), Size: fi.Size()})
			return ctx.Err()
		})
		if err != nil && !isPathNotFound(err) {
			return nil, fmt.Errorf("registry gc: list blobs: %w", err)
		}
	}
	if !dryRun {
		c.sweep(ctx, rep, now)
	}
	if len(rep.Failures) > 0 {
		rep.Remaining = true
	}
	var bytes int64
	for _, it := range rep.Deletions {
		bytes += it.Size
	}
	c.log.Info("registry gc pass", "dry_run", dryRun, "deletions", len(rep.Deletions), "blob_bytes", bytes,
		"kept_manifests", rep.KeptManifests, "kept_blobs", rep.KeptBlobs, "skipped", len(rep.Skipped),
		"failures", len(rep.Failures), "blobs_skipped", rep.BlobsSkipped, "remaining", rep.Remaining)
	return rep, nil
}

// judgeRepository marks what repo keeps and reports the tags and manifests
// that may go.
func (c *Collector) judgeRepository(ctx context.Context, repo string, now time.Time, roots map[digest.Digest]bool,
	keptTag map[string]bool, prunable map[string]string, marked map[digest.Digest]bool, rep *GCReport,
	dropTag func(string, digest.Digest), dropManifest func(digest.Digest)) error {
	named, err := reference.WithName(repo)
	if err != nil {
		return err
	}
	r, err := c.reg.ns.Repository(ctx, named)
	if err != nil {
		return err
	}
	ms, err := r.Manifests(ctx)
	if err != nil {
		return err
	}
	keep := map[digest.Digest]bool{}
	for d := range roots {
		keep[d] = true
	}
	tags, err := r.Tags(ctx).All(ctx)
	if err != nil && !isRepoUnknown(err) && !isPathNotFound(err) {
		return fmt.Errorf("tags: %w", err)
	}
	for _, tag := range tags {
		desc, err := r.Tags(ctx).Get(ctx, tag)
		if err != nil {
			return fmt.Errorf("tag %s: %w", tag, err)
		}
		id := repo + ":" + tag
		if d, ok := prunable[id]; ok && !keptTag[id] && d == desc.Digest.String() {
			dropTag(tag, desc.Digest)
			continue
		}
		keep[desc.Digest] = true
	}
	enum, ok := ms.(distribution.ManifestEnumerator)
	if !ok {
		return errors.New("the storage cannot list manifests")
	}
	var all []digest.Digest
	if err := enum.Enumerate(ctx, func(d digest.Digest) error { all = append(all, d); return nil }); err != nil && !isPathNotFound(err) {
		return fmt.Errorf("manifests: %w", err)
	}
	// Young manifests are kept, with everything they reference.
	for _, d := range all {
		if keep[d] {
			continue
		}
		fi, err := c.reg.drv.Stat(ctx, manifestLinkPath(repo, d))
		if err != nil {
			return fmt.Errorf("manifest %s: %w", d, err)
		}
		if !c.reg.idle(d, fi.ModTime(), now, c.policy.ManifestGrace) {
			keep[d] = true
		}
	}
	inRepo := map[digest.Digest]bool{}
	for _, d := range all {
		inRepo[d] = true
	}
	local := map[digest.Digest]bool{}
	var mark func(d digest.Digest) error
	mark = func(d digest.Digest) error {
		if local[d] {
			return nil
		}
		local[d], marked[d] = true, true
		if !inRepo[d] {
			return nil // a layer or config blob
		}
		m, err := ms.Get(ctx, d)
		if err != nil {
			return fmt.Errorf("read manifest %s: %w", d, err)
		}
		for _, ref := range m.References() {
			if err := mark(ref.Digest); err != nil {
				return err
			}
		}
		return nil
	}
	for d := range keep {
		if inRepo[d] {
			if err := mark(d); err != nil {
				return err
			}
		}
	}
	// A referrer (a signature, an SBOM) of a kept manifest stays with it.
	for changed := true; changed; {
		changed = false
		for _, d := range all {
			if local[d] {
				continue
			}
			m, err := ms.Get(ctx, d)
			if err != nil {
				return fmt.Errorf("read manifest %s: %w", d, err)
			}
			_, payload, err := m.Payload()
			if err != nil {
				return fmt.Errorf("read manifest %s: %w", d, err)
			}
			var sub struct {
				Subject *v1.Descriptor `json:"subject"`
			}
			if json.Unmarshal(payload, &sub) == nil && sub.Subject != nil && local[sub.Subject.Digest] {
				if err := mark(d); err != nil {
					return err
				}
				changed = true
			}
		}
	}
	for _, d := range all {
		if local[d] {
			rep.KeptManifests++
		} else {
			dropManifest(d)
		}
	}
	return nil
}

// sweep deletes rep.Deletions in order, re-reading each one's state first,
// and logs every deletion by digest. What it does not delete is moved to
// Failures (an error) or dropped from Deletions (it changed meanwhile).
func (c *Collector) sweep(ctx context.Context, rep *GCReport, markedAt time.Time) {
	vac := storage.NewVacuum(ctx, c.reg.drv)
	done := rep.Deletions[:0]
	for _, it := range rep.Deletions {
		if ctx.Err() != nil {
			rep.Failures = append(rep.Failures, "stopped: "+ctx.Err().Error())
			break
		}
		d, _ := digest.Parse(it.Digest)
		var err error
		switch it.Kind {
		case "tag":
			err = c.untag(ctx, it.Repository, it.Tag, d)
		case "manifest":
			err = c.deleteManifest(ctx, vac, it.Repository, d, markedAt)
		case "blob":
			err = c.deleteBlob(ctx, vac, d, markedAt)
		}
		if errors.Is(err, errChanged) {
			continue
		}
		if err != nil {
			rep.Failures = append(rep.Failures, it.Kind+" "+it.Repository+" "+it.Digest+": "+err.Error())
			continue
		}
		c.log.Info("registry gc deleted", "kind", it.Kind, "repository", it.Repository, "tag", it.Tag, "digest", it.Digest, "bytes", it.Size)
		done = append(done, it)
	}
	rep.Deletions = done
}

// errChanged: what a pass judged changed before it was deleted; it stays.
var errChanged = errors.New("berth: changed since the pass judged it")

func (c *Collector) repository(ctx context.Context, repo string) (distribution.Repository, error) {
	named, err := reference.WithName(repo)
	if err != nil {
		return nil, err
	}
	return c.reg.ns.Repository(ctx, named)
}

func (c *Collector) untag(ctx context.Context, repo, tag string, d digest.Digest) error {
	r, err := c.repository(ctx, repo)
	if err != nil {
		return err
	}
	desc, err := r.Tags(ctx).Get(ctx, tag)
	if err != nil || desc.Digest != d {
		return errChanged
	}
	return r.Tags(ctx).Untag(ctx, tag)
}

func (c *Collector) deleteManifest(ctx context.Context, vac storage.Vacuum, repo string, d digest.Digest, markedAt time.Time) error {
	fi, err := c.reg.drv.Stat(ctx, manifestLinkPath(repo, d))
	if isPathNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !c.reg.idle(d, fi.ModTime(), markedAt, c.policy.ManifestGrace) {
		return errChanged
	}
	r, err := c.repository(ctx, repo)
	if err != nil {
		return err
	}
	// A tag pushed since the pass judged it keeps it.
	if tags, err := r.Tags(ctx).Lookup(ctx, v1.Descriptor{Digest: d}); err != nil && !isPathNotFound(err) && !isRepoUnknown(err) {
		return err
	} else if len(tags) > 0 {
		return errChanged
	}
	if err := vac.RemoveManifest(repo, d, nil); err != nil && !isPathNotFound(err) {
		return err
	}
	return c.reg.forgetReferrer(ctx, repo, d.String())
}

func (c *Collector) deleteBlob(ctx context.Context, vac storage.Vacuum, d digest.Digest, markedAt time.Time) error {
	fi, err := c.reg.drv.Stat(ctx, blobDataPath(d))
	if isPathNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !c.reg.idle(d, fi.ModTime(), markedAt, c.policy.BlobGrace) {
		return errChanged
	}
	// The repositories' links to it go first, so that no repository names
	// a blob that is gone.
	enum := c.reg.ns.(distribution.RepositoryEnumerator)
	err = enum.Enumerate(ctx, func(repo string) error {
		if _, err := c.reg.drv.Stat(ctx, layerLinkPath(repo, d)); err == nil {
			return vac.RemoveLayer(repo, d)
		}
		return nil
	})
	if err != nil && !isPathNotFound(err) {
		return err
	}
	if err := vac.RemoveBlob(d.String()); err != nil && !isPathNotFound(err) {
		return err
	}
	return nil
}

// Storage paths of distribution's layout (its storage package keeps them private).
const storageRoot = "/docker/registry/v2"

func blobDataPath(d digest.Digest) string {
	h := d.Encoded()
	return storageRoot + "/blobs/" + d.Algorithm().String() + "/" + h[:2] + "/" + h + "/data"
}

func manifestLinkPath(repo string, d digest.Digest) string {
	return storageRoot + "/repositories/" + repo + "/_manifests/revisions/" + d.Algorithm().String() + "/" + d.Encoded() + "/link"
}

func layerLinkPath(repo string, d digest.Digest) string {
	return storageRoot + "/repositories/" + repo + "/_layers/" + d.Algorithm().String() + "/" + d.Encoded() + "/link"
}

func isPathNotFound(err error) bool {
	var pnf storagedriver.PathNotFoundError
	return errors.As(err, &pnf)
}

func isRepoUnknown(err error) bool {
	var ru distribution.ErrRepositoryUnknown
	return errors.As(err, &ru)
}

// splitImageRef returns the repository (without registry host) and digest
// of "[host/]<repo>@sha256:<hex>".
func splitImageRef(ref string) (string, digest.Digest, bool) {
	name, dg, ok := strings.Cut(ref, "@")
	if !ok {
		return "", "", false
	}
	d, err := digest.Parse(dg)
	if err != nil {
		return "", "", false
	}
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return "", "", false
	}
	return reference.Path(named), d, true
}

// usage remembers when each digest was last named by a registry request, so
// that a client that found a blob or manifest present keeps it for the
// grace period (the pass treats such a digest as used).
type usage struct {
	mu   sync.Mutex
	last map[digest.Digest]time.Time // mu must be held
}

// usageLimit bounds the remembered digests; beyond it the oldest half is
// forgotten (they are then judged by their write time alone).
const usageLimit = 200_000

func (u *usage) touch(d digest.Digest, at time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.last == nil {
		u.last = map[digest.Digest]time.Time{}
	}
	if len(u.last) >= usageLimit {
		times := make([]time.Time, 0, len(u.last))
		for _, t := range u.last {
			times = append(times, t)
		}
		sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
		cut := times[len(times)/2]
		for k, t := range u.last {
			if t.Before(cut) {
				delete(u.last, k)
			}
		}
	}
	u.last[d] = at
}

func (u *usage) lastUse(d digest.Digest) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last[d]
}

// idle reports whether d, written at written, was neither written nor used
// within grace before at.
func (r *Registry) idle(d digest.Digest, written, at time.Time, grace time.Duration) bool {
	cut := at.Add(-grace)
	return written.Before(cut) && !r.used.lastUse(d).After(cut)
}

// ManifestExists reports whether repo ("<project>/<name>") still holds the
// manifest dgst ("sha256:<hex>"), as a promotion asks before it points a
// service at it (docs/registry.md section 8): false once retention removed
// it. It counts as a request naming dgst, so a retention pass running
// meanwhile keeps the manifest for its grace period (section 10) and the
// service that is about to name it finds it there. Errors: a malformed
// repository or digest, or storage that cannot be read.
func (r *Registry) ManifestExists(ctx context.Context, repo, dgst string) (bool, error) {
	d, err := digest.Parse(dgst)
	if err != nil {
		return false, fmt.Errorf("registry: manifest %s of %s: %w", dgst, repo, err)
	}
	named, err := reference.WithName(repo)
	if err != nil {
		return false, fmt.Errorf("registry: manifest %s of %s: %w", dgst, repo, err)
	}
	r.used.touch(d, r.cfg.Now())
	rp, err := r.ns.Repository(ctx, named)
	if err != nil {
		return false, fmt.Errorf("registry: manifest %s of %s: %w", dgst, repo, err)
	}
	ms, err := rp.Manifests(ctx)
	if err != nil {
		return false, fmt.Errorf("registry: manifest %s of %s: %w", dgst, repo, err)
	}
	ok, err := ms.Exists(ctx, d)
	if err != nil && !isPathNotFound(err) && !isRepoUnknown(err) {
		return false, fmt.Errorf("registry: manifest %s of %s: %w", dgst, repo, err)
	}
	return ok && err == nil, nil
}

// storageFor builds the storage driver and namespace the collector walks: the
// same driver and parameters as the application's.
func storageFor(ctx context.Context, cfg Config) (storagedriver.StorageDriver, distribution.Namespace, error) {
	name, params := "filesystem", map[string]any{"rootdirectory": cfg.RootDir}
	if cfg.S3.Endpoint != "" {
		p, err := s3Parameters(cfg.S3)
		if err != nil {
			return nil, nil, err
		}
		name, params = "s3aws", p
	}
	drv, err := factory.Create(ctx, name, params)
	if err != nil {
		return nil, nil, fmt.Errorf("registry storage: %w", err)
	}
	ns, err := storage.NewRegistry(ctx, drv, storage.EnableDelete)
	if err != nil {
		return nil, nil, fmt.Errorf("registry storage: %w", err)
	}
	return drv, ns, nil
}

// Schedule of [Collector.Run] (docs/registry.md section 10).
const (
	GCFirstPass  = 3 * time.Minute // after start
	GCPeriod     = 24 * time.Hour  // between passes that finished their work
	GCRetryAfter = time.Hour       // after a pass that left work or failed
)

// Pass runs one collection (berthd runs it as the platform task "registry.gc", first
// GCFirstPass after start) and returns how long to wait before the next: GCPeriod after a pass
// that finished its work, GCRetryAfter after one that left work behind or failed.
func (c *Collector) Pass(ctx context.Context) (time.Duration, error) {
	rep, err := c.Collect(ctx, false)
	switch {
	case err != nil:
		return GCRetryAfter, err
	case rep.Remaining:
		return GCRetryAfter, nil
	default:
		return GCPeriod, nil
	}
}
