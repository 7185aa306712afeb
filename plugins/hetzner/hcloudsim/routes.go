package hcloudsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// route dispatches one authorised request.
func (s *Sim) route(w http.ResponseWriter, r *http.Request, path string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && path == "/servers":
		s.listServers(w, q)
	case r.Method == http.MethodPost && path == "/servers":
		s.createServer(w, r)
	case len(parts) == 2 && parts[0] == "servers":
		id, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			apiError(w, http.StatusNotFound, "not_found", "server not found")
			return
		}
		switch r.Method {
		case http.MethodGet:
			s.getServer(w, id)
		case http.MethodPut:
			s.updateServer(w, r, id)
		case http.MethodDelete:
			s.deleteServer(w, id)
		default:
			apiError(w, http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed")
		}
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "servers" && parts[2] == "actions":
		id, _ := strconv.ParseInt(parts[1], 10, 64)
		s.serverActions(w, id, q)
	case r.Method == http.MethodGet && path == "/actions":
		s.listActions(w, q)
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "actions":
		id, _ := strconv.ParseInt(parts[1], 10, 64)
		s.mu.Lock()
		a, ok := s.actions[id]
		if ok {
			s.pollLocked(a)
		}
		var out schema.Action
		if ok {
			out = a.a
		}
		s.mu.Unlock()
		if !ok {
			apiError(w, http.StatusNotFound, "not_found", "action not found")
			return
		}
		writeJSON(w, http.StatusOK, schema.ActionGetResponse{Action: out})
	case r.Method == http.MethodGet && path == "/server_types":
		s.mu.Lock()
		out := filterByName(s.serverTypes, q.Get("name"), func(t schema.ServerType) string { return t.Name })
		s.mu.Unlock()
		list(w, "server_types", out)
	case r.Method == http.MethodGet && path == "/locations":
		s.mu.Lock()
		out := filterByName(s.locations, q.Get("name"), func(l schema.Location) string { return l.Name })
		s.mu.Unlock()
		list(w, "locations", out)
	case r.Method == http.MethodGet && path == "/images":
		s.mu.Lock()
		out := filterByName(s.images, q.Get("name"), func(i schema.Image) string { return *i.Name })
		s.mu.Unlock()
		list(w, "images", out)
	case r.Method == http.MethodGet && path == "/ssh_keys":
		s.mu.Lock()
		out := filterByName(s.sshKeys, q.Get("name"), func(k schema.SSHKey) string { return k.Name })
		s.mu.Unlock()
		list(w, "ssh_keys", out)
	case r.Method == http.MethodGet && path == "/firewalls":
		s.mu.Lock()
		out := filterByName(s.firewalls, q.Get("name"), func(f schema.Firewall) string { return f.Name })
		s.mu.Unlock()
		list(w, "firewalls", out)
	case r.Method == http.MethodGet && path == "/placement_groups":
		s.mu.Lock()
		out := filterByName(s.placementGroups, q.Get("name"), func(p schema.PlacementGroup) string { return p.Name })
		s.mu.Unlock()
		list(w, "placement_groups", out)
	default:
		apiError(w, http.StatusNotFound, "not_found", "no such endpoint in the simulator: "+r.Method+" "+path)
	}
}

func filterByName[T any](items []T, name string, nameOf func(T) string) []T {
	out := []T{}
	for _, it := range items {
		if name == "" || nameOf(it) == name {
			out = append(out, it)
		}
	}
	return out
}

// list writes a one-page list response with its pagination meta.
func list[T any](w http.ResponseWriter, key string, items []T) {
	if items == nil {
		items = []T{}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		key:    items,
		"meta": schema.Meta{Pagination: &schema.MetaPagination{Page: 1, PerPage: max(len(items), 25), LastPage: 1, TotalEntries: len(items)}},
	})
}

func (s *Sim) listServers(w http.ResponseWriter, q url.Values) {
	sel, err := parseSelector(q.Get("label_selector"))
	if err != nil {
		apiError(w, http.StatusBadRequest, "invalid_input", err.Error())
		return
	}
	name := q.Get("name")
	s.mu.Lock()
	out := []schema.Server{}
	stale := len(sel) > 0 && s.staleLists > 0
	if stale {
		s.staleLists--
	}
	for _, sv := range s.servers {
		if stale {
			break
		}
		if (name == "" || sv.s.Name == name) && sel.matches(sv.s.Labels) {
			out = append(out, sv.s)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b schema.Server) int { return int(a.ID - b.ID) })
	list(w, "servers", out)
}

func (s *Sim) getServer(w http.ResponseWriter, id int64) {
	s.mu.Lock()
	sv, ok := s.servers[id]
	var out schema.Server
	if ok {
		out = sv.s
	}
	s.mu.Unlock()
	if !ok {
		apiError(w, http.StatusNotFound, "not_found", fmt.Sprintf("server with ID '%d' not found", id))
		return
	}
	writeJSON(w, http.StatusOK, schema.ServerGetResponse{Server: out})
}

func (s *Sim) createServer(w http.ResponseWriter, r *http.Request) {
	var req schema.ServerCreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "json_error", "invalid JSON: "+err.Error())
		return
	}
	s.mu.Lock()
	st, okT := findIDOrName(s.serverTypes, req.ServerType, func(t schema.ServerType) (int64, string) { return t.ID, t.Name })
	img, okI := findIDOrName(s.images, req.Image, func(i schema.Image) (int64, string) { return i.ID, *i.Name })
	loc, okL := findIDOrName(s.locations, schema.IDOrName{Name: req.Location}, func(l schema.Location) (int64, string) { return l.ID, l.Name })
	var invalid []string
	if req.Name == "" || len(req.Name) > 63 {
		invalid = append(invalid, "name: must be 1 to 63 characters")
	}
	if !okT {
		invalid = append(invalid, fmt.Sprintf("server_type: server type %q not found", req.ServerType.Name))
	}
	if !okI {
		invalid = append(invalid, fmt.Sprintf("image: image %q not found", req.Image.Name))
	}
	if req.Location == "" {
		loc, okL = s.locations[0], true
	}
	if !okL {
		invalid = append(invalid, fmt.Sprintf("location: location %q not found", req.Location))
	}
	for _, k := range req.SSHKeys {
		if !slices.ContainsFunc(s.sshKeys, func(x schema.SSHKey) bool { return x.ID == k }) {
			invalid = append(invalid, fmt.Sprintf("ssh_keys: ssh key %d not found", k))
		}
	}
	for _, f := range req.Firewalls {
		if !slices.ContainsFunc(s.firewalls, func(x schema.Firewall) bool { return x.ID == f.Firewall }) {
			invalid = append(invalid, fmt.Sprintf("firewalls: firewall %d not found", f.Firewall))
		}
	}
	if req.PlacementGroup != 0 && !slices.ContainsFunc(s.placementGroups, func(x schema.PlacementGroup) bool { return x.ID == req.PlacementGroup }) {
		invalid = append(invalid, fmt.Sprintf("placement_group: placement group %d not found", req.PlacementGroup))
	}
	if len(req.UserData) > 32*1024 {
		invalid = append(invalid, "user_data: at most 32 KiB")
	}
	if len(invalid) > 0 {
		s.mu.Unlock()
		apiError(w, http.StatusUnprocessableEntity, "invalid_input", "invalid input: "+strings.Join(invalid, "; "))
		return
	}
	for _, sv := range s.servers {
		if sv.s.Name == req.Name {
			s.mu.Unlock()
			apiError(w, http.StatusConflict, "uniqueness_error", "server name is already used")
			return
		}
	}
	labels := map[string]string{}
	if req.Labels != nil {
		for k, v := range *req.Labels {
			labels[k] = v
		}
	}
	sv := s.newServerLocked(req.Name, st, loc, img, labels)
	sv.userData, sv.sshKeys = req.UserData, req.SSHKeys
	for _, f := range req.Firewalls {
		sv.s.PublicNet.Firewalls = append(sv.s.PublicNet.Firewalls, schema.ServerFirewall{ID: f.Firewall, Status: "applied"})
	}
	if req.PlacementGroup != 0 {
		for i := range s.placementGroups {
			if pg := &s.placementGroups[i]; pg.ID == req.PlacementGroup {
				pg.Servers = append(pg.Servers, sv.s.ID)
				cp := *pg
				sv.s.PlacementGroup = &cp
			}
		}
	}
	s.created++
	id := sv.s.ID
	create := s.newActionLocked("create_server", id, s.stuck[req.Name], false)
	start := s.newActionLocked("start_server", id, s.stuck[req.Name], s.failStart[req.Name])
	sv.actions = append(sv.actions, create.a.ID, start.a.ID)
	create.then = func() {
		if sv, ok := s.servers[id]; ok {
			sv.s.Status = "starting"
		}
	}
	start.then = func() {
		if sv, ok := s.servers[id]; ok {
			if start.fail {
				sv.s.Status = "off"
			} else {
				sv.s.Status = "running"
			}
		}
	}
	resp := schema.ServerCreateResponse{Server: sv.s, Action: create.a, NextActions: []schema.Action{start.a}}
	hold := s.holdCreate
	s.holdCreate = nil
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return // the client gave up: the server exists, the answer is lost
		}
	}
	writeJSON(w, http.StatusCreated, resp)
}

func findIDOrName[T any](items []T, want schema.IDOrName, key func(T) (int64, string)) (T, bool) {
	for _, it := range items {
		id, name := key(it)
		if (want.ID != 0 && id == want.ID) || (want.Name != "" && name == want.Name) {
			return it, true
		}
	}
	var zero T
	return zero, false
}

func (s *Sim) newServerLocked(name string, st schema.ServerType, loc schema.Location, img schema.Image, labels map[string]string) *server {
	s.nextID++
	id := s.nextID
	if labels == nil {
		labels = map[string]string{}
	}
	imgCopy := img
	sv := &server{s: schema.Server{
		ID: id, Name: name, Status: "initializing", Created: s.now().UTC().Truncate(time.Second),
		ServerType: st, Location: loc, Image: &imgCopy, Labels: labels,
		PublicNet: schema.ServerPublicNet{
			IPv4:      schema.ServerPublicNetIPv4{ID: id, IP: fmt.Sprintf("198.51.100.%d", id%250+1)},
			IPv6:      schema.ServerPublicNetIPv6{ID: id, IP: fmt.Sprintf("2001:db8:%x::/64", id)},
			Firewalls: []schema.ServerFirewall{},
		},
		PrivateNet: []schema.ServerPrivateNet{}, Volumes: []int64{}, LoadBalancers: []int64{},
		IncludedTraffic: 21990232555520, PrimaryDiskSize: st.Disk,
	}}
	s.servers[id] = sv
	return sv
}

func (s *Sim) newActionLocked(command string, serverID int64, stuck, fail bool) *action {
	s.nextID++
	a := &action{a: schema.Action{ID: s.nextID, Status: "running", Command: command, Started: s.now().UTC(),
		Resources: []schema.ActionResourceReference{{ID: serverID, Type: "server"}}}, pollsLeft: s.actionPolls, fail: fail}
	if stuck {
		a.pollsLeft = -1
	}
	s.actions[a.a.ID] = a
	return a
}

// pollLocked advances a running action by one poll.
func (s *Sim) pollLocked(a *action) {
	if a.a.Status != "running" || a.pollsLeft < 0 {
		return
	}
	a.pollsLeft--
	a.a.Progress = min(100, a.a.Progress+50)
	if a.pollsLeft > 0 {
		return
	}
	fin := s.now().UTC()
	a.a.Finished, a.a.Progress = &fin, 100
	if a.fail {
		a.a.Status = "error"
		a.a.Error = &schema.ActionError{Code: "action_failed", Message: "Action failed: the server did not start"}
	} else {
		a.a.Status = "success"
	}
	if a.then != nil {
		a.then()
	}
}

func (s *Sim) listActions(w http.ResponseWriter, q url.Values) {
	s.mu.Lock()
	out := []schema.Action{}
	for _, raw := range q["id"] {
		id, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			continue
		}
		if a, ok := s.actions[id]; ok {
			s.pollLocked(a)
			out = append(out, a.a)
		}
	}
	s.mu.Unlock()
	list(w, "actions", out)
}

func (s *Sim) serverActions(w http.ResponseWriter, id int64, q url.Values) {
	s.mu.Lock()
	sv, ok := s.servers[id]
	out := []schema.Action{}
	if ok {
		for _, aid := range sv.actions {
			a := s.actions[aid]
			if st := q["status"]; len(st) == 0 || slices.Contains(st, a.a.Status) {
				out = append(out, a.a)
			}
		}
	}
	s.mu.Unlock()
	if !ok {
		apiError(w, http.StatusNotFound, "not_found", fmt.Sprintf("server with ID '%d' not found", id))
		return
	}
	list(w, "actions", out)
}

func (s *Sim) updateServer(w http.ResponseWriter, r *http.Request, id int64) {
	var req schema.ServerUpdateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "json_error", "invalid JSON: "+err.Error())
		return
	}
	s.mu.Lock()
	sv, ok := s.servers[id]
	if !ok {
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, "not_found", fmt.Sprintf("server with ID '%d' not found", id))
		return
	}
	if req.Name != "" {
		sv.s.Name = req.Name
	}
	if req.Labels != nil {
		sv.s.Labels = map[string]string{}
		for k, v := range *req.Labels {
			sv.s.Labels[k] = v
		}
	}
	out := sv.s
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, schema.ServerGetResponse{Server: out})
}

func (s *Sim) deleteServer(w http.ResponseWriter, id int64) {
	s.mu.Lock()
	if _, ok := s.servers[id]; !ok {
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, "not_found", fmt.Sprintf("server with ID '%d' not found", id))
		return
	}
	delete(s.servers, id)
	for i := range s.placementGroups {
		pg := &s.placementGroups[i]
		pg.Servers = slices.DeleteFunc(pg.Servers, func(x int64) bool { return x == id })
	}
	a := s.newActionLocked("delete_server", id, false, false)
	out := a.a
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, schema.ServerDeleteResponse{Action: out})
}

// selector is a parsed label selector: comma-separated terms, all of which
// must hold ("k=v", "k==v", "k!=v", "k", "!k").
type selector []term

type term struct {
	key, value string
	op         string // "=", "!=", "exists", "!exists"
}

func parseSelector(raw string) (selector, error) {
	var out selector
	if raw == "" {
		return out, nil
	}
	for _, t := range strings.Split(raw, ",") {
		t = strings.TrimSpace(t)
		switch {
		case strings.Contains(t, "!="):
			k, v, _ := strings.Cut(t, "!=")
			out = append(out, term{key: k, value: v, op: "!="})
		case strings.Contains(t, "=="):
			k, v, _ := strings.Cut(t, "==")
			out = append(out, term{key: k, value: v, op: "="})
		case strings.Contains(t, "="):
			k, v, _ := strings.Cut(t, "=")
			out = append(out, term{key: k, value: v, op: "="})
		case strings.HasPrefix(t, "!"):
			out = append(out, term{key: t[1:], op: "!exists"})
		case t != "":
			out = append(out, term{key: t, op: "exists"})
		default:
			return nil, fmt.Errorf("label_selector %q has an empty term", raw)
		}
	}
	return out, nil
}

func (sel selector) matches(labels map[string]string) bool {
	for _, t := range sel {
		v, ok := labels[t.key]
		switch t.op {
		case "=":
			if !ok || v != t.value {
				return false
			}
		case "!=":
			if ok && v == t.value {
				return false
			}
		case "exists":
			if !ok {
				return false
			}
		case "!exists":
			if ok {
				return false
			}
		}
	}
	return true
}
