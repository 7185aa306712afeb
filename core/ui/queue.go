package ui

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

// The operations and change-log pages (docs/ui.md section 1): the queued work of every
// project the viewer may read (GET /projects/{project}/operations) and the newest entries of
// the change log (GET /changelog). Neither shows a payload or a result: an operation's
// payload and a change's payload may carry what a page must not show.

// operationStates are the states an operation can be in (core/operations), the values the
// operations page's ?state= filter accepts.
var operationStates = []string{"queued", "leased", "retry", "succeeded", "failed"}

// operationRows is how many operations the operations page lists at most, newest first; the
// rest are counted.
const operationRows = 200

// operationRow is one operation with the name of its project (the API's answer carries the
// project's id only).
type operationRow struct {
	Project string
	Op      client.Operation
}

// operationsData is what the operations page shows: the operations in State ("" for every
// state), newest first, how many each state holds, and why there are none when the API has
// no operation queue.
type operationsData struct {
	State  string
	States []statusCount
	Rows   []operationRow
	Hidden int
	// Off says the API serves no operation queue (its routes are not mounted: 404).
	Off bool
}

// errBadState refuses an operations filter that names no state.
var errBadState = &client.APIError{Status: http.StatusBadRequest, Problem: client.Problem{Code: "validation_failed",
	Detail: "The state filter takes one of " + strings.Join(operationStates, ", ") + "."}}

// loadOperations lists the operations of every project the viewer may read through the API,
// newest first, keeping those in state ("" keeps all).
func loadOperations(ctx context.Context, c *client.Client, state string) (*operationsData, error) {
	if state != "" && !slices.Contains(operationStates, state) {
		return nil, errBadState
	}
	projects, err := c.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	d := &operationsData{State: state}
	counts := map[string]int{}
	for _, p := range projects {
		ops, err := c.ListOperations(ctx, p.Name)
		if client.IsCode(err, "forbidden") {
			continue // a token bound to another project
		}
		if apiStatus(err) == http.StatusNotFound && !client.IsCode(err, "project_not_found") {
			d.Off = true
			return d, nil
		}
		if err != nil {
			return nil, err
		}
		for _, op := range ops {
			counts[op.State]++
			if state == "" || op.State == state {
				d.Rows = append(d.Rows, operationRow{Project: p.Name, Op: op})
			}
		}
	}
	for _, st := range operationStates {
		d.States = append(d.States, statusCount{Status: st, Count: counts[st]})
	}
	slices.SortStableFunc(d.Rows, func(a, b operationRow) int {
		return cmp.Or(b.Op.CreatedAt.Compare(a.Op.CreatedAt), strings.Compare(a.Op.ID, b.Op.ID))
	})
	if len(d.Rows) > operationRows {
		d.Hidden = len(d.Rows) - operationRows
		d.Rows = d.Rows[:operationRows]
	}
	return d, nil
}

// changelogRows is how many of the change log's newest entries the change-log page shows.
const changelogRows = 100

// changelogKinds are the entity types the change-log page's kind field suggests (any other
// is accepted: the API matches it exactly).
var changelogKinds = []string{"service", "runtime_spec", "project", "node", "bundle", "image_release", "secret", "token", "user", "policy_binding"}

// changelogFilter is the change-log page's filter, from its query: Kind (entity_type), Op,
// Actor (actor_id) and Entity (entity_id) match exactly; Until (a seq) shows the entries at
// or below it, for the page of older entries.
type changelogFilter struct {
	Kind, Op, Actor, Entity string
	Until                   int64
}

// changelogFilterFrom reads the filter from a page or stream query.
func changelogFilterFrom(q map[string]string) changelogFilter {
	f := changelogFilter{Kind: q["kind"], Op: q["op"], Actor: q["actor"], Entity: q["entity"]}
	f.Until, _ = strconv.ParseInt(q["until"], 10, 64)
	return f
}

// Active reports whether f narrows the log to some entries.
func (f changelogFilter) Active() bool {
	return f.Kind != "" || f.Op != "" || f.Actor != "" || f.Entity != ""
}

// changelogData is what the change-log page shows: the newest entries that match the filter
// (at or below Until when set), newest first, the head's seq, and Next, the seq the older
// entries start at (0: there are none). Off says the API keeps no change log.
type changelogData struct {
	Filter  changelogFilter
	Kinds   []string
	Entries []node.LogEntry
	Head    int64
	Next    int64
	Off     bool
}

// loadChangelog reads the change log's newest changelogRows entries that match f through the
// API, newest first (GET /changelog?order=desc with the filter: the API scans, the page only
// shows).
func loadChangelog(ctx context.Context, c *client.Client, f changelogFilter) (*changelogData, error) {
	page, err := c.FindChangelog(ctx, client.ChangelogQuery{Desc: true, Limit: changelogRows, UntilSeq: f.Until,
		EntityType: f.Kind, Op: f.Op, ActorID: f.Actor, EntityID: f.Entity})
	if apiStatus(err) == http.StatusNotFound {
		return &changelogData{Off: true, Filter: f, Kinds: changelogKinds}, nil
	}
	if err != nil {
		return nil, err
	}
	return &changelogData{Filter: f, Kinds: changelogKinds, Entries: page.Entries, Head: page.HeadSeq, Next: page.NextSeq}, nil
}

// apiStatus is the HTTP status of an API error; 0 for nil or an error that is not the API's.
func apiStatus(err error) int {
	var apiErr *client.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Status
	}
	return 0
}

func (h *Handler) operationsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "operations", "Operations", map[string]string{"state": r.URL.Query().Get("state")})
}

// changelogPage shows the change log, filtered by the query's kind, op, actor and entity,
// from until (a seq) down when it is set.
func (h *Handler) changelogPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	q := map[string]string{}
	for _, k := range changelogQueryKeys {
		if val := r.URL.Query().Get(k); val != "" {
			q[k] = val
		}
	}
	h.page(w, r, v, "changelog", "Change log", q)
}

// changelogQueryKeys are the change-log page's query parameters (its filter form's fields).
var changelogQueryKeys = []string{"kind", "op", "actor", "entity", "until"}

// changelogURL is the change-log page with filter f from seq until down.
func changelogURL(f changelogFilter, until int64) string {
	v := url.Values{}
	for k, val := range map[string]string{"kind": f.Kind, "op": f.Op, "actor": f.Actor, "entity": f.Entity} {
		if val != "" {
			v.Set(k, val)
		}
	}
	v.Set("until", strconv.FormatInt(until, 10))
	return "/ui/changelog?" + v.Encode()
}
