/*
 * A C peer on rdma-core (librdmacm with a librdmacm-managed QP), speaking rdmapool's
 * connection conventions from docs/PROTOCOL.md: private data framed as 0xA7, length, data;
 * a region descriptor of 24 bytes ("RD", version 1, 0, address u64, length u64, rkey u32,
 * little-endian). The interop tests (crates/rdmapool/tests/interop.rs) run it in the
 * SoftRoCE guest against the Rust library.
 *
 *   cm_peer server IP PORT framed|unframed
 *       Exports 4096 bytes starting with "hello from C" to one client, accepting with the
 *       region descriptor (framed, or raw to provoke a framing error at the client). Prints
 *       the client's private data; after the client disconnects, prints the 16 bytes at
 *       offset 64 of the region ("written: ...").
 *   cm_peer client IP PORT framed|unframed
 *       Connects with private data "from C" (framed or not). When rejected, prints the
 *       unframed reason and exits 3. When accepted, decodes the descriptor, READs 16 bytes
 *       at its offset 0 one-sidedly, prints them ("read: ..."), WRITEs "C was here" at
 *       offset 32, and disconnects.
 * Exit status 0 on success, 3 when rejected, 1 on any error.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FRAME_MAGIC 0xA7
#define DESC_LEN 24
#define REGION 4096

static int die(const char *what) {
	perror(what);
	return 1;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n) {
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* Frames `data` into `out` (2 + len bytes); returns the framed length. */
static int frame(uint8_t *out, const void *data, uint8_t len) {
	out[0] = FRAME_MAGIC;
	out[1] = len;
	memcpy(out + 2, data, len);
	return 2 + len;
}

/* Unframes delivered private data; returns the data length or -1 if not framed. */
static int unframe(const uint8_t *raw, int raw_len, const uint8_t **data) {
	if (raw_len < 2 || raw[0] != FRAME_MAGIC || raw[1] > raw_len - 2)
		return -1;
	*data = raw + 2;
	return raw[1];
}

static struct rdma_cm_id *make_ep(const char *ip, const char *port, int passive) {
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *id;
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(ip, port, &hints, &res)) {
		perror("rdma_getaddrinfo");
		return NULL;
	}
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	/* On a listening endpoint the attributes are for the QPs of the requests it gets. */
	if (rdma_create_ep(&id, res, NULL, &attr)) {
		perror("rdma_create_ep");
		id = NULL;
	}
	rdma_freeaddrinfo(res);
	return id;
}

static int server(const char *ip, const char *port, int framed) {
	struct rdma_cm_id *listen_id = make_ep(ip, port, 1), *id;
	struct rdma_conn_param param;
	struct rdma_cm_event *ev;
	uint8_t desc[DESC_LEN], pd_buf[2 + DESC_LEN];
	char *region = calloc(1, REGION);
	struct ibv_mr *mr;
	if (!listen_id || !region)
		return 1;
	if (rdma_listen(listen_id, 1))
		return die("rdma_listen");
	printf("listening\n");
	fflush(stdout);
	if (rdma_get_request(listen_id, &id))
		return die("rdma_get_request");
	{
		const uint8_t *data;
		int n = unframe(id->event->param.conn.private_data,
				id->event->param.conn.private_data_len, &data);
		if (n < 0)
			printf("request: not framed\n");
		else
			printf("request: %.*s\n", n, (const char *)data);
	}
	strcpy(region, "hello from C");
	mr = ibv_reg_mr(id->pd, region, REGION,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		return die("ibv_reg_mr");
	desc[0] = 'R';
	desc[1] = 'D';
	desc[2] = 1;
	desc[3] = 0;
	put_le(desc + 4, (uint64_t)(uintptr_t)region, 8);
	put_le(desc + 12, REGION, 8);
	put_le(desc + 20, mr->rkey, 4);
	memset(&param, 0, sizeof param);
	param.responder_resources = param.initiator_depth = 1;
	param.retry_count = param.rnr_retry_count = 7;
	if (framed) {
		param.private_data = pd_buf;
		param.private_data_len = (uint8_t)frame(pd_buf, desc, DESC_LEN);
	} else {
		param.private_data = desc;
		param.private_data_len = DESC_LEN;
	}
	if (rdma_accept(id, &param))
		return die("rdma_accept");
	/* Wait for the client to go away (it disconnects, or its QP is destroyed). */
	for (;;) {
		if (rdma_get_cm_event(id->channel, &ev))
			return die("rdma_get_cm_event");
		int kind = ev->event;
		rdma_ack_cm_event(ev);
		if (kind == RDMA_CM_EVENT_DISCONNECTED || kind == RDMA_CM_EVENT_REJECTED ||
		    kind == RDMA_CM_EVENT_CONNECT_ERROR)
			break;
	}
	printf("written: %.16s\n", region + 64);
	rdma_disconnect(id);
	ibv_dereg_mr(mr);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	return 0;
}

static int client(const char *ip, const char *port, int framed) {
	struct rdma_cm_id *id = make_ep(ip, port, 0);
	struct rdma_conn_param param;
	struct ibv_wc wc;
	uint8_t pd_buf[2 + 8];
	char *buf = calloc(1, 64);
	struct ibv_mr *mr;
	const uint8_t *data = (const uint8_t *)"";
	uint64_t addr;
	uint32_t rkey;
	int n;
	if (!id || !buf)
		return 1;
	mr = ibv_reg_mr(id->pd, buf, 64, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		return die("ibv_reg_mr");
	memset(&param, 0, sizeof param);
	param.responder_resources = param.initiator_depth = 1;
	param.retry_count = param.rnr_retry_count = 7;
	if (framed) {
		param.private_data = pd_buf;
		param.private_data_len = (uint8_t)frame(pd_buf, "from C", 6);
	} else {
		param.private_data = "RDMA from C";
		param.private_data_len = 11;
	}
	if (rdma_connect(id, &param)) {
		/* The synchronous API reports a reject as ECONNREFUSED with the event kept. */
		if (id->event && id->event->event == RDMA_CM_EVENT_REJECTED) {
			n = unframe(id->event->param.conn.private_data,
				    id->event->param.conn.private_data_len, &data);
			printf("rejected: %.*s\n", n < 0 ? 0 : n, (const char *)data);
			return 3;
		}
		return die("rdma_connect");
	}
	n = unframe(id->event ? id->event->param.conn.private_data : NULL,
		    id->event ? id->event->param.conn.private_data_len : 0, &data);
	if (n != DESC_LEN || data[0] != 'R' || data[1] != 'D' || data[2] != 1) {
		fprintf(stderr, "accept private data is not a framed region descriptor\n");
		return 1;
	}
	addr = get_le(data + 4, 8);
	rkey = (uint32_t)get_le(data + 20, 4);
	if (rdma_post_read(id, NULL, buf, 16, mr, 0, addr, rkey))
		return die("rdma_post_read");
	if (rdma_get_send_comp(id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "READ failed: %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	printf("read: %.16s\n", buf);
	strcpy(buf + 32, "C was here");
	if (rdma_post_write(id, NULL, buf + 32, 11, mr, 0, addr + 32, rkey))
		return die("rdma_post_write");
	if (rdma_get_send_comp(id, &wc) <= 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "WRITE failed: %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	fflush(stdout);
	rdma_disconnect(id);
	ibv_dereg_mr(mr);
	rdma_destroy_ep(id);
	return 0;
}

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 5) {
		fprintf(stderr, "usage: %s server|client IP PORT framed|unframed\n", argv[0]);
		return 1;
	}
	int framed = strcmp(argv[4], "framed") == 0;
	if (strcmp(argv[1], "server") == 0)
		return server(argv[2], argv[3], framed);
	if (strcmp(argv[1], "client") == 0)
		return client(argv[2], argv[3], framed);
	fprintf(stderr, "unknown mode %s\n", argv[1]);
	return 1;
}
