package ui

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
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

// changelogData is what the change-log page shows: the newest entries, newest first, and the
// head's seq. Off says the API keeps no change log.
type changelogData struct {
	Entries []node.LogEntry
	Head    int64
	Off     bool
}

// loadChangelog reads the change log's newest changelogRows entries through the API: the
// head's seq first (a one-entry read), then the entries up to it.
func loadChangelog(ctx context.Context, c *client.Client) (*changelogData, error) {
	_, head, err := c.Changelog(ctx, 1, 1)
	if apiStatus(err) == http.StatusNotFound {
		return &changelogData{Off: true}, nil
	}
	if err != nil {
		return nil, err
	}
	d := &changelogData{Head: head}
	if head < 1 {
		return d, nil
	}
	from := max(1, head-changelogRows+1)
	entries, _, err := c.Changelog(ctx, from, changelogRows)
	if err != nil {
		return nil, err
	}
	slices.Reverse(entries)
	d.Entries = entries
	return d, nil
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

func (h *Handler) changelogPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "changelog", "Change log", nil)
}
