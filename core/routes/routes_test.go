package routes

import (
	"context"
	"reflect"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
)

func TestNativeCompile(t *testing.T) {
	in := Input{
		Services: []Service{
			{ID: "svc_b", Project: "p", Name: "b", Domains: []string{"Hello.Localhost."}},
			{ID: "svc_a", Project: "p", Name: "a", Domains: []string{"hello.localhost", "a.localhost"}},
			{ID: "svc_c", Project: "p", Name: "c"},
			{ID: "svc_d", Project: "p", Name: "d", Domains: []string{"*.d.example.test", "m.example.test"}, TLSMode: abiroutes.TLSACME},
		},
		Workloads: []Workload{
			{ID: "wl_2", ServiceID: "svc_a", Address: "127.0.0.1:2", ObservedStatus: "running", Health: "failing"},
			{ID: "wl_1", ServiceID: "svc_a", Address: "127.0.0.1:1", ObservedStatus: "running", Health: "passing"},
			{ID: "wl_3", ServiceID: "svc_a", ObservedStatus: "starting"},
			{ID: "wl_4", ServiceID: "svc_b", Address: "127.0.0.1:4", ObservedStatus: "running", Health: "passing"},
		},
	}
	got, err := Native{}.Compile(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	ups := []abiroutes.Upstream{{WorkloadID: "wl_1", Address: "127.0.0.1:1", Healthy: true}, {WorkloadID: "wl_2", Address: "127.0.0.1:2"}}
	want := abiroutes.Table{Routes: []abiroutes.Route{
		{Hostname: "*.d.example.test", Project: "p", Service: "d", TLSMode: abiroutes.TLSACME, HTTPSRedirect: true},
		{Hostname: "a.localhost", Project: "p", Service: "a", Upstreams: ups},
		{Hostname: "hello.localhost", Project: "p", Service: "a", Upstreams: ups},
		{Hostname: "m.example.test", Project: "p", Service: "d", TLSMode: abiroutes.TLSACME, HTTPSRedirect: true},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	again, _ := Native{}.Compile(context.Background(), in)
	if again.Digest() != got.Digest() {
		t.Fatal("same input, different digest")
	}
}
