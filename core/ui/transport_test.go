package ui

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestInProcessStreamsNDJSON: a request that accepts application/x-ndjson is answered as soon
// as the API's handler sent its status, its lines arrive while the handler still runs, and
// the handler's trailer is in the answer after the body ended.
func TestInProcessStreamsNDJSON(t *testing.T) {
	release := make(chan struct{})
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", ndjson)
		w.Header().Set("Trailer", "Berth-Stream-End")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"line":"first"}`+"\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `{"line":"second"}`+"\n")
		w.Header().Set("Berth-Stream-End", "end")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, apiBase+"/api/v1/workloads/wl_x/logs?follow=true", nil)
	req.Header.Set("Accept", ndjson+", application/problem+json")
	resp, err := inProcess{api: api}.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ndjson {
		t.Fatalf("answer %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != `{"line":"first"}`+"\n" {
		t.Fatalf("the first line before the handler ended: %q, %v", first, err)
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != `{"line":"second"}`+"\n" {
		t.Fatalf("the rest: %q, %v", rest, err)
	}
	if got := resp.Trailer.Get("Berth-Stream-End"); got != "end" {
		t.Fatalf("trailer Berth-Stream-End %q, want end", got)
	}
}

// TestInProcessStreamEndsWithTheCaller: closing a streamed answer's body ends the API's
// handler (its next write fails), so no goroutine outlives the dashboard's stream.
func TestInProcessStreamEndsWithTheCaller(t *testing.T) {
	done := make(chan struct{})
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(done)
		w.WriteHeader(http.StatusOK)
		for i := 0; i < 1_000_000; i++ {
			if _, err := io.WriteString(w, "{}\n"); err != nil {
				return
			}
		}
	})
	req, _ := http.NewRequest(http.MethodGet, apiBase+"/api/v1/x", nil)
	req.Header.Set("Accept", ndjson)
	resp, err := inProcess{api: api}.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler still writes after the body was closed")
	}
}

// TestInProcessStreamSurvivesAPanic: a streamed handler that panics cuts its answer short
// with an error, as net/http does, and does not take the process down.
func TestInProcessStreamSurvivesAPanic(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "{}\n")
		panic("a handler bug")
	})
	req, _ := http.NewRequest(http.MethodGet, apiBase+"/api/v1/x", nil)
	req.Header.Set("Accept", ndjson)
	resp, err := inProcess{api: api}.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("the answer of a panicking handler read without its error: %v", err)
	}
}
