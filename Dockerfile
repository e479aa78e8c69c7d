# syntax=docker/dockerfile:1

# Build a static binary: modernc.org/sqlite is pure Go, so CGO stays off.
FROM golang:1.26-bookworm AS build
# The service is the cmd module, built on the library at the root (cmd/go.mod's replace), on its
# own go.mod as make test checks it.
WORKDIR /src
ENV GOWORK=off
COPY go.mod go.sum ./
COPY cmd/go.mod cmd/go.sum ./cmd/
RUN cd cmd && go mod download
COPY . .
ARG VERSION=dev
RUN cd cmd && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/postguard ./postguard

# A static binary needs no libc; distroless adds CA certificates (for api.resend.com) and a
# non-root user.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/postguard /usr/local/bin/postguard
USER nonroot:nonroot
WORKDIR /home/nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/postguard"]
CMD ["serve"]
