// Package hcloudsim is a stateful, in-memory stand-in for the Hetzner Cloud
// API (https://docs.hetzner.cloud, the REST API at https://api.hetzner.cloud/v1),
// for tests: the server, action, catalog and rate-limit parts the hetzner
// provider plugin uses, built from hcloud-go's own hcloud/schema types.
//
// It serves on loopback only; the test that starts it stops it (Close).
// Besides the API it offers faults a test arms: injected 500s, a create that
// answers only after the client gave up, a server stuck initializing, a
// failed start_server, a small rate-limit budget; and it keeps a log of every
// request and a count of created servers, for tests to assert on.
package hcloudsim

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// Token is the API token the simulator accepts for reads and writes;
// ReadOnlyToken is accepted for reads only (writes answer 403 forbidden).
const (
	Token         = "sim-token-read-write"
	ReadOnlyToken = "sim-token-read-only"
)

// Request is one request the simulator received.
type Request struct {
	Method string
	Path   string
	Query  string    // raw query string
	Status int       // the status answered
	At     time.Time // when it arrived
}

// Sim is a running simulator. Its methods are safe for concurrent use.
type Sim struct {
	// URL is the API endpoint to give hcloud.WithEndpoint.
	URL string

	srv *httptest.Server
	now func() time.Time

	mu              sync.Mutex
	nextID          int64
	servers         map[int64]*server
	actions         map[int64]*action
	serverTypes     []schema.ServerType
	locations       []schema.Location
	images          []schema.Image
	sshKeys         []schema.SSHKey
	firewalls       []schema.Firewall
	placementGroups []schema.PlacementGroup
	log             []Request
	created         int
	actionPolls     int

	// faults
	fail        []failure
	holdCreate  chan struct{} // non-nil: the next create waits on it before answering
	staleLists  int           // server lists by label selector still to answer empty
	stuck       map[string]bool
	failStart   map[string]bool
	limit       int
	remaining   int
	resetAt     time.Time
	resetPeriod time.Duration
}

type server struct {
	s        schema.Server
	userData string
	sshKeys  []int64
	actions  []int64
}

type action struct {
	a         schema.Action
	pollsLeft int  // polls until it finishes; <0 never
	fail      bool // finishes with an error
	then      func()
}

type failure struct {
	method, prefix string
	status         int
	code           string
	left           int
}

// Start runs a simulator on a loopback port with a catalog of server types
// (cx22, cx32, cpx11), locations (fsn1, nbg1, hel1), images (ubuntu-24.04,
// debian-12), an SSH key "ops" (id 1), a firewall "berth-nodes" (id 2) and
// a spread placement group "berth-spread" (id 3). Actions finish on their
// second poll; the rate limit is 3,600 requests an hour as on the real API.
func Start() *Sim {
	s := &Sim{
		now: time.Now, nextID: 100, servers: map[int64]*server{}, actions: map[int64]*action{},
		stuck: map[string]bool{}, failStart: map[string]bool{}, actionPolls: 2,
		limit: 3600, remaining: 3600, resetPeriod: time.Second,
	}
	for i, n := range []struct {
		name         string
		cores        int
		mem          float32
		disk         int
		architecture string
	}{{"cx22", 2, 4, 40, "x86"}, {"cx32", 4, 8, 80, "x86"}, {"cpx11", 2, 2, 40, "x86"}} {
		s.serverTypes = append(s.serverTypes, schema.ServerType{ID: int64(i + 1), Name: n.name, Description: strings.ToUpper(n.name),
			Cores: n.cores, Memory: n.mem, Disk: n.disk, StorageType: "local", CPUType: "shared", Architecture: n.architecture})
	}
	for i, l := range []struct{ name, city, country, zone string }{{"fsn1", "Falkenstein", "DE", "eu-central"}, {"nbg1", "Nuremberg", "DE", "eu-central"}, {"hel1", "Helsinki", "FI", "eu-central"}} {
		s.locations = append(s.locations, schema.Location{ID: int64(i + 1), Name: l.name, Description: l.city, City: l.city, Country: l.country, NetworkZone: l.zone})
	}
	for i, n := range []string{"ubuntu-24.04", "debian-12"} {
		name := n
		s.images = append(s.images, schema.Image{ID: int64(i + 1), Name: &name, Type: "system", Status: "available", Architecture: "x86", OSFlavor: strings.Split(n, "-")[0]})
	}
	s.sshKeys = []schema.SSHKey{{ID: 1, Name: "ops", Fingerprint: "b7:2f:30:a0:2f:6c:58:6c:21:04:58:61:ba:06:3b:2c", PublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9w ops", Labels: map[string]string{}}}
	s.firewalls = []schema.Firewall{{ID: 2, Name: "berth-nodes", Labels: map[string]string{}}}
	s.placementGroups = []schema.PlacementGroup{{ID: 3, Name: "berth-spread", Type: "spread", Labels: map[string]string{}, Servers: []int64{}}}
	s.resetAt = s.now()
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("hcloudsim: listen on loopback: %v", err))
	}
	s.srv.Listener = l
	s.srv.Start()
	s.URL = s.srv.URL + "/v1"
	return s
}

// Close stops the simulator, releasing any held create first.
func (s *Sim) Close() {
	s.mu.Lock()
	if s.holdCreate != nil {
		close(s.holdCreate)
		s.holdCreate = nil
	}
	s.mu.Unlock()
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Reset forgets every server and action, the log, the creation count and
// the armed faults; the catalog stays.
func (s *Sim) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.servers, s.actions, s.log, s.created = map[int64]*server{}, map[int64]*action{}, nil, 0
	s.fail, s.stuck, s.failStart, s.staleLists = nil, map[string]bool{}, map[string]bool{}, 0
	s.limit, s.remaining, s.resetAt = 3600, 3600, s.now()
}

// Log returns a copy of the requests received so far, oldest first.
func (s *Sim) Log() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// Created returns how many servers POST /servers created in all.
func (s *Sim) Created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created
}

// Servers returns the live servers, by id.
func (s *Sim) Servers() []schema.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []schema.Server
	for _, sv := range s.servers {
		out = append(out, sv.s)
	}
	slices.SortFunc(out, func(a, b schema.Server) int { return int(a.ID - b.ID) })
	return out
}

// UserData returns the user data the server named name was created with.
func (s *Sim) UserData(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sv := range s.servers {
		if sv.s.Name == name {
			return sv.userData, true
		}
	}
	return "", false
}

// AddServer creates a server directly, as another tool or an earlier
// process would have, running at once.
func (s *Sim) AddServer(name string, labels map[string]string) schema.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	sv := s.newServerLocked(name, s.serverTypes[0], s.locations[0], s.images[0], labels)
	sv.s.Status = "running"
	return sv.s
}

// SetActionPolls makes new actions finish on their n-th poll (n >= 1).
func (s *Sim) SetActionPolls(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.actionPolls = max(n, 1)
}

// FailNext makes the next n requests whose method is method and whose path
// (after /v1) starts with prefix answer status with the API error code.
func (s *Sim) FailNext(method, prefix string, n, status int, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = append(s.fail, failure{method: method, prefix: prefix, status: status, code: code, left: n})
}

// HoldNextCreate makes the next POST /servers create the server and then
// answer only when release is called (or the simulator closes): the
// client sees a timeout while the server exists.
func (s *Sim) HoldNextCreate() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.holdCreate = ch
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// StaleNextLists makes the next n GET /servers with a label selector
// answer an empty list, as a read that has not caught up with a create
// would.
func (s *Sim) StaleNextLists(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staleLists = n
}

// StuckInitializing makes the server named name, once created, stay
// initializing: its create_server action never finishes.
func (s *Sim) StuckInitializing(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stuck[name] = true
}

// FailStart makes the start_server action of the server named name fail.
func (s *Sim) FailStart(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failStart[name] = true
}

// SetRateLimit gives the project a budget of limit requests that is full
// again reset after it is first drawn on; RateLimit-Reset then names that
// moment, and a request beyond the budget answers 429.
func (s *Sim) SetRateLimit(limit int, reset time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit, s.remaining, s.resetPeriod, s.resetAt = limit, limit, reset, s.now()
}

// apiError writes a Hetzner error body.
func apiError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, schema.ErrorResponse{Error: schema.Error{Code: code, Message: msg, DetailsRaw: json.RawMessage("null")}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// serve is the API: auth, rate limit, injected faults, then the routes.
func (s *Sim) serve(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	path := strings.TrimPrefix(r.URL.Path, "/v1")
	arrived := s.now()
	defer func() {
		s.mu.Lock()
		s.log = append(s.log, Request{Method: r.Method, Path: path, Query: r.URL.RawQuery, Status: rec.status, At: arrived})
		s.mu.Unlock()
	}()
	w = rec
	auth := r.Header.Get("Authorization")
	if auth != "Bearer "+Token && auth != "Bearer "+ReadOnlyToken {
		apiError(w, http.StatusUnauthorized, "unauthorized", "unable to authenticate")
		return
	}
	if r.Method != http.MethodGet && auth != "Bearer "+Token {
		apiError(w, http.StatusForbidden, "forbidden", "insufficient permissions for this request: the token is read-only")
		return
	}
	s.mu.Lock()
	if !s.budgetLocked(w) {
		s.mu.Unlock()
		apiError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "limit of requests per hour reached")
		return
	}
	for i := range s.fail {
		f := &s.fail[i]
		if f.left > 0 && f.method == r.Method && strings.HasPrefix(path, f.prefix) {
			f.left--
			s.mu.Unlock()
			apiError(w, f.status, f.code, "injected failure")
			return
		}
	}
	s.mu.Unlock()
	s.route(w, r, path)
}

// budgetLocked draws one request from the budget and sets the RateLimit-*
// headers; false when the budget is empty.
func (s *Sim) budgetLocked(w http.ResponseWriter) bool {
	now := s.now()
	if !now.Before(s.resetAt) && s.remaining < s.limit {
		s.remaining = s.limit
	}
	if s.remaining == s.limit {
		s.resetAt = now.Add(s.resetPeriod)
	}
	ok := s.remaining > 0
	if ok {
		s.remaining--
	}
	h := w.Header()
	h.Set("RateLimit-Limit", strconv.Itoa(s.limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(s.remaining))
	// Whole seconds, rounded up, as the real API sends them.
	reset := s.resetAt.Unix()
	if s.resetAt.Nanosecond() > 0 {
		reset++
	}
	h.Set("RateLimit-Reset", strconv.FormatInt(reset, 10))
	return ok
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}
