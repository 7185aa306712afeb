package routes

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	abiroutes "github.com/berthhq/berth/abi/routes"
)

// Claims maps a hostname (lower case, no trailing dot) to the id of the
// service that holds its route claim (docs/routes.md section 2). A claim
// whose service is not in the compiler's input counts as no claim.
type Claims map[string]string

// Withheld is one service's declaration of a hostname that is not served
// for it because another service holds the hostname's claim.
type Withheld struct {
	Hostname string
	Project  string
	Service  string
	// Owner is the claim holder the hostname is served for, "project/name".
	Owner string
}

// ErrClaimBroken is returned by [Resolution.Enforce] for a compiled table
// that routes a hostname held for one service (by its claim, or as its one
// declarer) to another service or to upstreams that are not that service's
// workloads. The caller refuses the whole table and keeps its last good one.
var ErrClaimBroken = errors.New("berth: the route table gives a held hostname to another service")

// Resolution is what [ResolveClaims] decided about who serves each
// hostname; the zero value decides nothing. [Resolution.Enforce] holds a
// compiled table to it.
type Resolution struct {
	// Excluded lists, by hostname, the hostnames two or more services
	// declare while none of them holds the claim: served for none of them.
	Excluded []abiroutes.Exclusion
	// Withheld lists, by hostname then project/name, the declarations left
	// out because another declarer holds the claim.
	Withheld []Withheld

	holder   map[string]Service // hostname -> the service it is served for
	upstream map[string]heldBy  // workload id -> its service and the addresses it may be routed at
	excluded map[string]bool
}

// heldBy is a workload's service id and the addresses a compiler may route
// it at.
type heldBy struct {
	service string
	addrs   []string
}

// ResolveClaims decides who serves each hostname of in (docs/routes.md
// section 2) and returns in without the declarations that lose:
//
//  1. a hostname one service declares is served for it;
//  2. a hostname several services declare is served for the one holding
//     its claim alone, and the others' declarations are withheld;
//  3. a hostname several services declare, none of which holds its claim,
//     is served for none of them and listed in Excluded.
//
// Every other hostname is untouched. Pure and deterministic; in is not
// modified and the result shares none of its slices.
func ResolveClaims(in Input, claims Claims) (Input, Resolution) {
	declarers := map[string][]int{} // hostname -> indexes into in.Services
	for i, s := range in.Services {
		seen := map[string]bool{}
		for _, d := range s.Domains {
			h := normalizeHost(d)
			if h == "" || seen[h] {
				continue
			}
			seen[h] = true
			declarers[h] = append(declarers[h], i)
		}
	}
	res := Resolution{holder: map[string]Service{}, upstream: map[string]heldBy{}, excluded: map[string]bool{}}
	drop := map[int]map[string]bool{} // service index -> hostnames it loses
	lose := func(i int, h string) {
		if drop[i] == nil {
			drop[i] = map[string]bool{}
		}
		drop[i][h] = true
	}
	hosts := make([]string, 0, len(declarers))
	for h, idx := range declarers {
		if len(idx) > 1 {
			hosts = append(hosts, h)
		}
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		idx := declarers[h]
		sort.Slice(idx, func(a, b int) bool { return qualified(in.Services[idx[a]]) < qualified(in.Services[idx[b]]) })
		won := -1
		if id, ok := claims[h]; ok {
			for _, i := range idx {
				if in.Services[i].ID == id {
					won = i
				}
			}
		}
		if won < 0 {
			names := make([]string, len(idx))
			for k, i := range idx {
				names[k] = qualified(in.Services[i])
				lose(i, h)
			}
			res.excluded[h] = true
			res.Excluded = append(res.Excluded, abiroutes.Exclusion{Hostname: h,
				Reason: fmt.Sprintf("claimed by %s; none of them holds its claim", joinNames(names))})
			continue
		}
		owner := in.Services[won]
		for _, i := range idx {
			if i == won {
				continue
			}
			lose(i, h)
			s := in.Services[i]
			res.Withheld = append(res.Withheld, Withheld{Hostname: h, Project: s.Project, Service: s.Name, Owner: qualified(owner)})
		}
	}
	out := Input{Services: make([]Service, len(in.Services)), Workloads: append([]Workload(nil), in.Workloads...)}
	for i, s := range in.Services {
		s.Domains = slices.DeleteFunc(append([]string(nil), s.Domains...), func(d string) bool { return drop[i][normalizeHost(d)] })
		out.Services[i] = s
		for _, d := range s.Domains { // one declarer per hostname is left
			if h := normalizeHost(d); h != "" {
				res.holder[h] = held(s)
			}
		}
	}
	// A claim held by a service of in holds a hostname nobody declares too.
	byID := make(map[string]Service, len(in.Services))
	for _, s := range in.Services {
		byID[s.ID] = held(s)
	}
	for h, id := range claims {
		if s, ok := byID[id]; ok && !res.excluded[h] {
			if _, declared := res.holder[h]; !declared {
				res.holder[h] = s
			}
		}
	}
	for _, w := range in.Workloads {
		res.upstream[w.ID] = heldBy{service: w.ServiceID, addrs: upstreamAddresses(w)}
	}
	return out, res
}

// held is s as a holder of hostnames: its identity without its domains.
func held(s Service) Service { return Service{ID: s.ID, Project: s.Project, Name: s.Name} }

// Enforce holds t to the resolution whatever compiler made it
// (docs/routes.md section 2): a route for an excluded hostname is removed
// and t.Excluded is set to the resolution's exclusions; a route for a
// hostname held for a service (its claim holder, or its one declarer) must
// name that service and route only to that service's workloads, at an
// address its input gave (docs/wasm-abi.md section 6.1). A table that breaks
// the latter is refused whole: the error wraps [ErrClaimBroken] and names
// every such hostname, and t must not be used. A compiler given the input
// [ResolveClaims] returned produces no such route; Enforce is there for
// compilers that route hostnames elsewhere than they were given.
func (r Resolution) Enforce(t *abiroutes.Table) error {
	t.Routes = slices.DeleteFunc(t.Routes, func(rt abiroutes.Route) bool { return r.excluded[rt.Hostname] })
	t.Excluded = append([]abiroutes.Exclusion(nil), r.Excluded...)
	var broken []string
	for _, rt := range t.Routes {
		if why := r.breaks(rt); why != "" {
			broken = append(broken, why)
		}
	}
	if len(broken) == 0 {
		return nil
	}
	sort.Strings(broken)
	const most = 5
	more := ""
	if len(broken) > most {
		more = fmt.Sprintf(" (and %d more)", len(broken)-most)
		broken = broken[:most]
	}
	return fmt.Errorf("%s%s: %w", strings.Join(broken, "; "), more, ErrClaimBroken)
}

// breaks returns why rt breaks the hostname's holding, "" when it does not.
func (r Resolution) breaks(rt abiroutes.Route) string {
	h, ok := r.holder[rt.Hostname]
	if !ok {
		return ""
	}
	if rt.Project != h.Project || rt.Service != h.Name {
		return fmt.Sprintf("hostname %s is held by %s but routed to %s/%s", rt.Hostname, qualified(h), rt.Project, rt.Service)
	}
	for _, u := range rt.Upstreams {
		w, ok := r.upstream[u.WorkloadID]
		if !ok || w.service != h.ID || !slices.Contains(w.addrs, u.Address) {
			return fmt.Sprintf("hostname %s is held by %s but routed to upstream %s at %s, not one of its workloads", rt.Hostname, qualified(h), u.WorkloadID, u.Address)
		}
	}
	return ""
}

func normalizeHost(d string) string { return strings.ToLower(strings.TrimSuffix(d, ".")) }

func qualified(s Service) string { return s.Project + "/" + s.Name }

// joinNames writes "a and b" or "a, b and c".
func joinNames(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}
