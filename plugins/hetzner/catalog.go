package hetzner

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// catalogTTL is how long the server types, locations and resolved names
// are trusted before they are asked for again.
const catalogTTL = time.Hour

// catalog caches what rarely changes (server types, locations, image and
// reference names) so that a Plan or a create costs no API calls for it in
// the steady state. Only found names are cached. Safe for concurrent use.
type catalog struct {
	client *hcloud.Client
	now    func() time.Time

	mu        sync.Mutex
	fetched   time.Time                    // of types and locations; mu must be held
	types     map[string]hcloud.ServerType // by name; mu must be held
	locations map[string]bool              // mu must be held
	names     map[string]cached            // "kind/name": resolved id; mu must be held
}

type cached struct {
	id int64
	at time.Time
}

func newCatalog(c *hcloud.Client) *catalog {
	return &catalog{client: c, now: time.Now, names: map[string]cached{}}
}

// load fetches the server types and locations when the cache is stale.
func (c *catalog) load(ctx context.Context) error {
	c.mu.Lock()
	fresh := c.types != nil && c.now().Sub(c.fetched) < catalogTTL
	c.mu.Unlock()
	if fresh {
		return nil
	}
	types, err := c.client.ServerType.All(ctx)
	if err != nil {
		return apiErr("list server types", err)
	}
	locs, err := c.client.Location.All(ctx)
	if err != nil {
		return apiErr("list locations", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.types, c.locations, c.fetched = map[string]hcloud.ServerType{}, map[string]bool{}, c.now()
	for _, t := range types {
		c.types[t.Name] = *t
	}
	for _, l := range locs {
		c.locations[l.Name] = true
	}
	return nil
}

// check refuses, with the API's catalog as reason, a server type, location
// or image that does not exist.
func (c *catalog) check(ctx context.Context, a Attributes) error {
	if err := c.load(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	st, okT := c.types[a.ServerType]
	okL := c.locations[a.Location]
	types, locs := keys(c.types), keys(c.locations)
	c.mu.Unlock()
	var problems []string
	if !okT {
		problems = append(problems, fmt.Sprintf("server type %q does not exist (the API offers %s)", a.ServerType, strings.Join(types, ", ")))
	}
	if !okL {
		problems = append(problems, fmt.Sprintf("location %q does not exist (the API offers %s)", a.Location, strings.Join(locs, ", ")))
	}
	if len(problems) > 0 {
		return abierrors.New(abierrors.ProviderInvalidInput, "hetzner: "+strings.Join(problems, "; "))
	}
	if _, err := c.resolve(ctx, "image/"+string(st.Architecture), a.Image, func(ctx context.Context, name string) (int64, error) {
		img, _, err := c.client.Image.GetForArchitecture(ctx, name, st.Architecture)
		if err != nil || img == nil {
			return 0, err
		}
		return img.ID, nil
	}); err != nil {
		return err
	}
	return nil
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// resolve returns the id of the object of kind named name (a numeric name
// is the id itself), looking it up with find when not cached; a name find
// does not know is refused provider_invalid_input.
func (c *catalog) resolve(ctx context.Context, kind, name string, find func(context.Context, string) (int64, error)) (int64, error) {
	if id, err := strconv.ParseInt(name, 10, 64); err == nil && id > 0 {
		return id, nil
	}
	key := kind + "/" + name
	c.mu.Lock()
	e, ok := c.names[key]
	c.mu.Unlock()
	if ok && c.now().Sub(e.at) < catalogTTL {
		return e.id, nil
	}
	id, err := find(ctx, name)
	if err != nil {
		return 0, apiErr("look up "+strings.SplitN(kind, "/", 2)[0]+" "+name, err)
	}
	if id == 0 {
		return 0, abierrors.New(abierrors.ProviderInvalidInput, fmt.Sprintf("hetzner: %s %q does not exist in the project", strings.SplitN(kind, "/", 2)[0], name))
	}
	c.mu.Lock()
	c.names[key] = cached{id: id, at: c.now()}
	c.mu.Unlock()
	return id, nil
}

// createRefs resolves a's SSH keys, firewall and placement group to ids.
func (c *catalog) createRefs(ctx context.Context, a Attributes) (keys []*hcloud.SSHKey, fw []*hcloud.ServerCreateFirewall, pg *hcloud.PlacementGroup, err error) {
	for _, k := range a.SSHKeys {
		id, err := c.resolve(ctx, "ssh key", k, func(ctx context.Context, n string) (int64, error) {
			x, _, err := c.client.SSHKey.GetByName(ctx, n)
			if err != nil || x == nil {
				return 0, err
			}
			return x.ID, nil
		})
		if err != nil {
			return nil, nil, nil, err
		}
		keys = append(keys, &hcloud.SSHKey{ID: id})
	}
	if a.Firewall != "" {
		id, err := c.resolve(ctx, "firewall", a.Firewall, func(ctx context.Context, n string) (int64, error) {
			x, _, err := c.client.Firewall.GetByName(ctx, n)
			if err != nil || x == nil {
				return 0, err
			}
			return x.ID, nil
		})
		if err != nil {
			return nil, nil, nil, err
		}
		fw = []*hcloud.ServerCreateFirewall{{Firewall: hcloud.Firewall{ID: id}}}
	}
	if a.Placement != "" {
		id, err := c.resolve(ctx, "placement group", a.Placement, func(ctx context.Context, n string) (int64, error) {
			x, _, err := c.client.PlacementGroup.GetByName(ctx, n)
			if err != nil || x == nil {
				return 0, err
			}
			return x.ID, nil
		})
		if err != nil {
			return nil, nil, nil, err
		}
		pg = &hcloud.PlacementGroup{ID: id}
	}
	return keys, fw, pg, nil
}
