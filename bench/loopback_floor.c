// The floor under any server's latency at concurrency 1 on this machine: two processes bounce a
// message over loopback TCP (TCP_NODELAY, blocking sockets, no protocol at all) and the client
// times each round trip. A server's p50 minus this p50 is what its protocol stack, scheduling
// and model add; issue 8's "kiln p50 − in-process p50" also counts these two wake-ups.
//
//   gcc -O2 -o /tmp/loopback_floor bench/loopback_floor.c && /tmp/loopback_floor [trips] [bytes]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int trips = argc > 1 ? atoi(argv[1]) : 100000;
    int size = argc > 2 ? atoi(argv[2]) : 200;
    static char buf[65536];
    if (trips <= 0 || size <= 0 || size > (int)sizeof buf) {
        fprintf(stderr, "usage: %s [trips > 0] [bytes 1..65536]\n", argv[0]);
        return 2;
    }
    int one = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 1) ||
        getsockname(listener, (struct sockaddr *)&addr, &len)) {
        perror("listen");
        return 1;
    }
    pid_t echo = fork();
    if (echo == 0) {
        int conn = accept(listener, NULL, NULL);
        setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (;;) {
            ssize_t got = recv(conn, buf, sizeof buf, 0);
            if (got <= 0 || send(conn, buf, (size_t)got, 0) != got) _exit(0);
        }
    }
    int conn = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(conn, (struct sockaddr *)&addr, sizeof addr)) {
        perror("connect");
        return 1;
    }
    setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double *took = malloc(sizeof(double) * (size_t)trips);
    memset(buf, 1, (size_t)size);
    double start = now_us();
    for (int i = 0; i < trips; i++) {
        double sent = now_us();
        if (send(conn, buf, (size_t)size, 0) != size) return 1;
        for (int got = 0; got < size;) {
            ssize_t n = recv(conn, buf, sizeof buf, 0);
            if (n <= 0) return 1;
            got += (int)n;
        }
        took[i] = now_us() - sent;
    }
    double elapsed = now_us() - start;
    close(conn);
    waitpid(echo, NULL, 0);
    qsort(took, (size_t)trips, sizeof(double), by_value);
    printf("%d round trips of %d bytes: %.0f/s, p50 %.0f us, p99 %.0f us\n", trips, size,
           trips / elapsed * 1e6, took[trips / 2], took[(size_t)trips * 99 / 100]);
    free(took);
    return 0;
}
