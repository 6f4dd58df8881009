package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/holdfast/holdfast/algorithms/tokenbucket"
	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/grpclimit"
)

// A gRPC service whose every method is limited to a burst of 2 calls per
// client (the x-client-id metadata), refilled at one a second: the third
// call in a burst ends with ResourceExhausted and a RetryInfo.
func Example() {
	// A fixed clock keeps the output stable; omit Clock in a service.
	now := time.Unix(1_700_000_000, 0)
	store, _ := memory.New(memory.Options{Clock: func() time.Time { return now }}) // or a Redis store, wrapped in fallback.New
	defer store.Close()
	limiter, _ := core.NewLimiter(store, core.Options{})
	policy, _ := tokenbucket.Policy("api", 2, 1)

	rules := grpclimit.Rules{"*": {Policy: policy, Key: grpclimit.Metadata("x-client-id")}}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiter, rules)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiter, rules)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer()) // your services
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()

	conn, _ := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-client-id", "client-42")
	for range 3 {
		var md metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		st := status.Convert(err)
		fmt.Println(st.Code(), md.Get("ratelimit-policy"), md.Get("ratelimit"), md.Get("retry-after"))
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Printf("  %s; retry in %v\n", st.Message(), ri.GetRetryDelay().AsDuration())
			}
		}
	}
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}) // no x-client-id
	fmt.Println(status.Code(err), status.Convert(err).Message())
	// Output:
	// OK ["api";q=2;w=2] ["api";r=1;t=1] []
	// OK ["api";q=2;w=2] ["api";r=0;t=2] []
	// ResourceExhausted ["api";q=2;w=2] ["api";r=0;t=1] [1]
	//   rate limited by policy "api"; retry in 1s
	// InvalidArgument missing metadata x-client-id
}
