package store

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// readCommands are the commands that change no document; every other command on the view's
// database (or on admin) that parseWrite does not understand reloads every loaded collection.
var readCommands = map[string]bool{
	"find": true, "getMore": true, "count": true, "distinct": true, "listCollections": true,
	"listIndexes": true, "hello": true, "isMaster": true, "ismaster": true, "ping": true,
	"buildInfo": true, "buildinfo": true, "endSessions": true, "killCursors": true, "listDatabases": true,
	"collStats": true, "dbStats": true, "serverStatus": true, "getParameter": true, "explain": true,
	"create": true, "createIndexes": true, "saslStart": true, "saslContinue": true, "authenticate": true,
	"getLastError": true, "connectionStatus": true, "hostInfo": true, "getCmdLineOpts": true,
	"abortTransaction": true, "commitTransaction": true, "getLog": true, "whatsmyuri": true,
}

// parseWrite returns what a command sent to database may change, and false when it changes
// nothing the view holds. See the comment at the top of view.go (step 1).
func parseWrite(name string, cmd bson.Raw, database string) (touch, bool) {
	db, _ := cmd.Lookup("$db").StringValueOK()
	if db != database && db != "admin" {
		return touch{}, false
	}
	if name == "aggregate" {
		if !pipelineWrites(cmd) {
			return touch{}, false
		}
		return touch{all: true}, true
	}
	if readCommands[name] {
		return touch{}, false
	}
	if db != database {
		// Admin commands that write name their namespaces in their own ways
		// (renameCollection, bulkWrite): reload everything.
		return touch{all: true}, true
	}
	coll, _ := cmd.Lookup(name).StringValueOK()
	switch name {
	case "insert":
		return idsOf(coll, cmd, "documents")
	case "update":
		return idsOf(coll, cmd, "updates")
	case "delete":
		return idsOf(coll, cmd, "deletes")
	case "findAndModify", "findandmodify":
		if coll == "" {
			return touch{all: true}, true
		}
		if ids, ok := filterIDs(cmd, "query"); ok && (!upsert(cmd) || plainID(cmd, "query")) {
			return touch{coll: coll, ids: ids}, true
		}
		return touch{coll: coll, reload: true}, true
	case "drop":
		if coll == "" {
			return touch{all: true}, true
		}
		return touch{coll: coll, reload: true}, true
	}
	return touch{all: true}, true
}

// idsOf collects the _id each statement of the array field names (an inserted document's own
// _id, or the _id its filter "q" restricts to); a statement naming none reloads the collection,
// and so does an upsert whose filter is an $in (it inserts a document with a new _id).
func idsOf(coll string, cmd bson.Raw, field string) (touch, bool) {
	if coll == "" {
		return touch{all: true}, true
	}
	whole := touch{coll: coll, reload: true}
	arr, ok := cmd.Lookup(field).ArrayOK()
	if !ok {
		return whole, true
	}
	vals, err := arr.Values()
	if err != nil {
		return whole, true
	}
	t := touch{coll: coll}
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			return whole, true
		}
		if field == "documents" {
			id, err := d.LookupErr("_id")
			if err != nil {
				return whole, true
			}
			t.ids = append(t.ids, id)
			continue
		}
		ids, ok := filterIDs(d, "q")
		if !ok || (upsert(d) && !plainID(d, "q")) {
			return whole, true
		}
		t.ids = append(t.ids, ids...)
	}
	return t, true
}

// plainID reports whether the filter d[field] names its _id by plain equality or $eq, the only
// shapes whose upsert inserts that _id.
func plainID(d bson.Raw, field string) bool {
	q, _ := d.Lookup(field).DocumentOK()
	op, isDoc := q.Lookup("_id").DocumentOK()
	if !isDoc {
		return true
	}
	elems, err := op.Elements()
	if err != nil || len(elems) == 0 {
		return false
	}
	k := elems[0].Key()
	return !strings.HasPrefix(k, "$") || k == "$eq"
}

// upsert reports whether a statement or findAndModify command asks for an upsert.
func upsert(d bson.Raw) bool {
	b, ok := d.Lookup("upsert").BooleanOK()
	return ok && b
}

// filterIDs returns the _id values the filter in d[field] restricts to: an equality on _id, an
// $eq, or an $in of plain values. false when the filter does not restrict _id that way (the
// write may touch any document).
func filterIDs(d bson.Raw, field string) ([]bson.RawValue, bool) {
	q, ok := d.Lookup(field).DocumentOK()
	if !ok {
		return nil, false
	}
	id, err := q.LookupErr("_id")
	if err != nil {
		return nil, false
	}
	op, isDoc := id.DocumentOK()
	if !isDoc {
		if id.Type == bson.TypeRegex {
			return nil, false
		}
		return []bson.RawValue{id}, true
	}
	elems, err := op.Elements()
	if err != nil || len(elems) == 0 {
		return nil, false
	}
	if len(elems[0].Key()) == 0 || elems[0].Key()[0] != '$' {
		return []bson.RawValue{id}, true // an _id that is itself a document
	}
	if len(elems) != 1 {
		return nil, false
	}
	switch elems[0].Key() {
	case "$eq":
		return []bson.RawValue{elems[0].Value()}, true
	case "$in":
		arr, ok := elems[0].Value().ArrayOK()
		if !ok {
			return nil, false
		}
		vals, err := arr.Values()
		if err != nil {
			return nil, false
		}
		for _, v := range vals {
			if v.Type == bson.TypeRegex || v.Type == bson.TypeEmbeddedDocument {
				return nil, false
			}
		}
		return vals, true
	}
	return nil, false
}

// pipelineWrites reports whether an aggregate command ends in $out or $merge.
func pipelineWrites(cmd bson.Raw) bool {
	arr, ok := cmd.Lookup("pipeline").ArrayOK()
	if !ok {
		return false
	}
	vals, _ := arr.Values()
	for _, v := range vals {
		if d, ok := v.DocumentOK(); ok {
			if _, err := d.LookupErr("$out"); err == nil {
				return true
			}
			if _, err := d.LookupErr("$merge"); err == nil {
				return true
			}
		}
	}
	return false
}
