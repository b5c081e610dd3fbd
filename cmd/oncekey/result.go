package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
)

// resultFlags are the flags of resolve that describe the stored result.
// Each format is encoded by the adapter's own exported encoder
// (claimhttp.ResponseResult, claimgrpc.ReplyResult and StatusResult), so
// the adapter replays exactly what was resolved; a result it could not
// replay is refused before anything is written.
//
// -format has no default: the record does not say which adapter guards its
// operation, and any default would silently write that format for records
// of the others (what resolve did before: HTTP results that claimgrpc
// replayed as OK).
type resultFlags struct {
	format                   *string
	status                   *int
	body, bodyFile, ctype    *string
	code, message            *string
	messageType, descriptors *string
	version                  *int
}

func (r *resultFlags) register(fs *flag.FlagSet) {
	r.format = fs.String("format", "", "the result format of the adapter that guards the operation (required, no default): http (claimhttp; claimriver when its Handler enqueued the job), grpc (claimgrpc), message (claimnats, claimamqp, claimriver without its Handler: a redelivery is acknowledged, nothing replayed)")
	r.status = fs.Int("status", 0, "http: the response status, 200 to 599 (required); message: a status for the application (default 0)")
	r.body = fs.String("body", "", "http, message: the result body; grpc -as completed: the reply in protobuf JSON (default {})")
	r.bodyFile = fs.String("body-file", "", "read -body from this file instead")
	r.ctype = fs.String("content-type", "", "http, message: the Content-Type header of the result")
	r.code = fs.String("code", "", "grpc -as failed: the status code, by name (NotFound or NOT_FOUND) or number 1 to 16 (required)")
	r.message = fs.String("message", "", "grpc -as failed: the status message")
	r.messageType = fs.String("message-type", "", "grpc -as completed: the reply's full protobuf name, e.g. shop.v1.ChargeReply (required)")
	r.descriptors = fs.String("descriptor-set", "", "grpc -as completed: a FileDescriptorSet with -message-type and its imports (protoc --include_imports --descriptor_set_out=F, buf build -o F) (required)")
	r.version = fs.Int("result-version", 0, "message: the version of the application's result representation (default 0)")
}

// result returns the result to store and how to show it, or a usage error.
func (r *resultFlags) result(fs *flag.FlagSet, state durable.State) (durable.Result, string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// only refuses the flags given that the format does not take: a flag
	// ignored would be a result the operator did not mean.
	only := func(what string, allowed ...string) error {
		ok := map[string]bool{"format": true}
		for _, a := range allowed {
			ok[a] = true
		}
		for _, name := range []string{"status", "body", "body-file", "content-type", "code", "message", "message-type", "descriptor-set", "result-version"} {
			if set[name] && !ok[name] {
				if name == "status" && *r.format == "grpc" {
					return usagef("-format grpc takes -code (a gRPC code), not -status (an HTTP status such as %d is no gRPC code)", *r.status)
				}
				return usagef("%s takes no -%s", what, name)
			}
		}
		return nil
	}
	if set["body"] && set["body-file"] {
		return durable.Result{}, "", usagef("give -body or -body-file, not both")
	}
	switch *r.format {
	case "":
		return durable.Result{}, "", usagef("-format is required (http, grpc or message): the format of the adapter that replays the result")
	case "http":
		if err := only("-format http", "status", "body", "body-file", "content-type"); err != nil {
			return durable.Result{}, "", err
		}
		if !set["status"] {
			return durable.Result{}, "", usagef("-format http needs -status, the response status 200 to 599")
		}
		body, err := r.readBody()
		if err != nil {
			return durable.Result{}, "", err
		}
		res, err := claimhttp.ResponseResult(*r.status, r.header(), body)
		if err != nil {
			return durable.Result{}, "", usagef("%v", err)
		}
		// claimhttp stores what a handler answered below 400 as completed,
		// the rest as failed (workflow mode, where nothing is released): a
		// resolution is one of what the middleware itself could have stored.
		switch {
		case state == durable.Failed && res.StatusCode < 400:
			return durable.Result{}, "", usagef("-as failed needs a status of 400 to 599, got %d: claimhttp stores a response below 400 as completed (use -as completed)", res.StatusCode)
		case state == durable.Completed && res.StatusCode >= 400:
			return durable.Result{}, "", usagef("-as completed needs a status below 400, got %d: claimhttp stores 400 and above as failed (use -as failed)", res.StatusCode)
		}
		return res, fmt.Sprintf("HTTP status %d", res.StatusCode), nil
	case "grpc":
		if state == durable.Failed {
			return r.grpcFailed(only)
		}
		return r.grpcCompleted(only)
	case "message":
		if err := only("-format message", "status", "body", "body-file", "content-type", "result-version"); err != nil {
			return durable.Result{}, "", err
		}
		if *r.status < 0 || *r.status > 999 {
			return durable.Result{}, "", usagef("-status must be 0 to 999, got %d", *r.status)
		}
		body, err := r.readBody()
		if err != nil {
			return durable.Result{}, "", err
		}
		res := durable.Result{StatusCode: *r.status, Headers: r.header(), Body: body, Version: *r.version}
		return res, fmt.Sprintf("message result, status %d", res.StatusCode), nil
	default:
		return durable.Result{}, "", usagef("-format must be http, grpc or message, got %q", *r.format)
	}
}

func (r *resultFlags) grpcFailed(only func(string, ...string) error) (durable.Result, string, error) {
	if err := only("-format grpc -as failed (a status: -code and -message)", "code", "message"); err != nil {
		return durable.Result{}, "", err
	}
	if *r.code == "" {
		return durable.Result{}, "", usagef("-format grpc -as failed needs -code, the gRPC status code (NotFound, NOT_FOUND or 5)")
	}
	c, ok := parseCode(*r.code)
	if !ok {
		return durable.Result{}, "", usagef("-code %q is not a gRPC error code: a name such as NotFound or NOT_FOUND, or a number 1 to 16", *r.code)
	}
	res, err := claimgrpc.StatusResult(status.New(c, *r.message))
	if err != nil {
		return durable.Result{}, "", usagef("%v", err)
	}
	return res, "gRPC " + c.String(), nil
}

func (r *resultFlags) grpcCompleted(only func(string, ...string) error) (durable.Result, string, error) {
	if err := only("-format grpc -as completed (a reply: -descriptor-set, -message-type and -body)", "body", "body-file", "message-type", "descriptor-set"); err != nil {
		return durable.Result{}, "", err
	}
	if *r.messageType == "" || *r.descriptors == "" {
		return durable.Result{}, "", usagef("-format grpc -as completed needs -message-type, the reply's full protobuf name, and -descriptor-set, a file that describes it: a completed gRPC call is its reply message")
	}
	b, err := os.ReadFile(*r.descriptors)
	if err != nil {
		return durable.Result{}, "", usagef("-descriptor-set: %v", err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		return durable.Result{}, "", usagef("-descriptor-set: not a FileDescriptorSet: %v", err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		return durable.Result{}, "", usagef("-descriptor-set: %v (build it with its imports: protoc --include_imports)", err)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(*r.messageType))
	if err != nil {
		return durable.Result{}, "", usagef("-message-type %q is not in the descriptor set", *r.messageType)
	}
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		return durable.Result{}, "", usagef("-message-type %q is not a message", *r.messageType)
	}
	body, err := r.readBody()
	if err != nil {
		return durable.Result{}, "", err
	}
	if len(body) == 0 {
		body = []byte("{}")
	}
	m := dynamicpb.NewMessage(md)
	if err := (protojson.UnmarshalOptions{Resolver: dynamicpb.NewTypes(files)}).Unmarshal(body, m); err != nil {
		return durable.Result{}, "", usagef("-body is not a %s in protobuf JSON: %v", md.FullName(), err)
	}
	res, err := claimgrpc.ReplyResult(m)
	if err != nil {
		return durable.Result{}, "", usagef("%v", err)
	}
	return res, "gRPC OK, " + string(md.FullName()), nil
}

func (r *resultFlags) readBody() ([]byte, error) {
	if *r.bodyFile == "" {
		return []byte(*r.body), nil
	}
	b, err := os.ReadFile(*r.bodyFile)
	if err != nil {
		return nil, usagef("-body-file: %v", err)
	}
	return b, nil
}

func (r *resultFlags) header() map[string][]string {
	if *r.ctype == "" {
		return nil
	}
	return map[string][]string{"Content-Type": {*r.ctype}}
}

// parseCode reads a gRPC error code: its name as grpc-go prints it
// (NotFound) or as the status guide writes it (NOT_FOUND), any case, or its
// number; OK and codes beyond Unauthenticated (16) are refused.
func parseCode(s string) (codes.Code, bool) {
	if n, err := strconv.Atoi(s); err == nil {
		return codes.Code(n), n >= 1 && n <= int(codes.Unauthenticated)
	}
	name := strings.ReplaceAll(s, "_", "")
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		if strings.EqualFold(name, c.String()) {
			return c, true
		}
	}
	return 0, false
}
