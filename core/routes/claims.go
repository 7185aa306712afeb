package routes

import (
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

// Resolution is what [ResolveClaims] decided about contested hostnames;
// the zero value decides nothing. [Resolution.Enforce] applies it to a
// compiled table.
type Resolution struct {
	// Excluded lists, by hostname, the hostnames two or more services
	// declare while none of them holds the claim: served for none of them.
	Excluded []abiroutes.Exclusion
	// Withheld lists, by hostname then project/name, the declarations left
	// out because another declarer holds the claim.
	Withheld []Withheld

	owner    map[string][2]string // contested hostname -> {project, name} it is served for
	excluded map[string]bool
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
	res := Resolution{owner: map[string][2]string{}, excluded: map[string]bool{}}
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
		res.owner[h] = [2]string{owner.Project, owner.Name}
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
	}
	return out, res
}

// Enforce makes t keep the resolution whatever compiler made it: a route
// for an excluded hostname is removed, a route for a contested hostname
// that names another service than its claim holder is removed, and
// t.Excluded is set to the resolution's exclusions. A compiler given the
// input [ResolveClaims] returned produces no such route; Enforce is there
// for compilers that route hostnames they were not given.
func (r Resolution) Enforce(t *abiroutes.Table) {
	t.Routes = slices.DeleteFunc(t.Routes, func(rt abiroutes.Route) bool {
		if r.excluded[rt.Hostname] {
			return true
		}
		o, ok := r.owner[rt.Hostname]
		return ok && (o[0] != rt.Project || o[1] != rt.Service)
	})
	t.Excluded = append([]abiroutes.Exclusion(nil), r.Excluded...)
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
