package claimgrpc_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable/sqlite"
)

// The server interceptor guards a Charge method; the client interceptor
// gives the call a key and sends it with every attempt. A retry of the same
// logical call (here: the same key, sent again) gets the stored reply and
// the charge happens once. The example runs on the embedded SQLite store;
// in production use durable/postgres and Redis.
func ExampleUnaryServerInterceptor() {
	dir, _ := os.MkdirTemp("", "claimgrpc-example")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "oncekey.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if err := sqlite.Migrate(context.Background(), db); err != nil {
		panic(err)
	}
	store, err := sqlite.New(db)
	if err != nil {
		panic(err)
	}
	claimer, err := claim.New[*sql.Tx](store)
	if err != nil {
		panic(err)
	}
	// The tenant comes from authentication; here a fixed one.
	tenant := func(ctx context.Context) (string, error) { return "tenant-42", nil }
	guard, err := claimgrpc.UnaryServerInterceptor(claimer, tenant)
	if err != nil {
		panic(err)
	}
	var charges atomic.Int64
	charge := func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		n := charges.Add(1) // the effect
		return wrapperspb.String(fmt.Sprintf("charge %d of %s", n, in.GetValue())), nil
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(guard))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "example.Payments",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Charge",
			Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.StringValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				info := &grpc.UnaryServerInfo{FullMethod: "/example.Payments/Charge"}
				return icpt(ctx, in, info, func(ctx context.Context, req any) (any, error) {
					return charge(ctx, req.(*wrapperspb.StringValue))
				})
			},
		}},
	}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	keys, err := claimgrpc.UnaryClientInterceptor(claimgrpc.WithAttempts(3))
	if err != nil {
		panic(err)
	}
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(keys))
	if err != nil {
		panic(err)
	}
	defer cc.Close()

	ctx := claimgrpc.KeyContext(context.Background(), "8e03978e-40d5-43e8-bc93-6894a57f9324")
	for range 2 {
		var out wrapperspb.StringValue
		var header metadata.MD
		if err := cc.Invoke(ctx, "/example.Payments/Charge", wrapperspb.String("EUR 10"), &out, grpc.Header(&header)); err != nil {
			panic(err)
		}
		fmt.Println(out.GetValue(), header.Get(claimgrpc.MetadataReplayed))
	}
	fmt.Println("charges:", charges.Load())
	// Output:
	// charge 1 of EUR 10 []
	// charge 1 of EUR 10 [true]
	// charges: 1
}
