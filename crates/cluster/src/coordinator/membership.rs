//! The cluster's members: workers joining and leaving, heartbeats, peer tables, and
//! control calls to workers (benchmark relays included).

use super::*;

/// How long statements wait for a starting cluster's workers.
pub const STARTING_WAIT: Duration = Duration::from_secs(30);

impl Coordinator {
    /// Workers currently alive, in id order: partition `i` of a query runs on the `i`-th.
    pub fn live_workers(&self) -> Vec<NodeId> {
        self.members
            .read()
            .iter()
            .filter(|(_, m)| m.alive)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Every live worker's counters, in id order, with its control address. A worker
    /// that does not answer within 10 s fails the call, naming it.
    pub async fn worker_stats(&self) -> Result<Vec<(NodeId, String, WorkerStats)>> {
        let workers = self.live_workers();
        let stats = self
            .gather(
                &workers,
                Request::Stats,
                "counters",
                Some(Duration::from_secs(10)),
                |r| match r {
                    Response::Stats(s) => Ok(s),
                    other => Err(Box::new(other)),
                },
            )
            .await?;
        let members = self.members.read();
        Ok(workers
            .into_iter()
            .zip(stats)
            .map(|(w, stats)| {
                let addr = members
                    .get(&w)
                    .map(|m| m.control.addr().to_string())
                    .unwrap_or_default();
                (w, addr, stats)
            })
            .collect())
    }

    /// Waits until at least `n` workers are registered.
    /// A cluster that starts `n` workers of its own (`gyre local`) serves its port
    /// before they are in, since they register through it: until `n` registered,
    /// statements wait (at most [`STARTING_WAIT`]), so that no table is loaded onto
    /// fewer workers than the cluster has.
    pub fn expect_workers(&self, n: usize) {
        self.expected_workers.store(n, Ordering::SeqCst);
    }

    /// The live workers, or `None` while fewer have registered than
    /// [`Coordinator::expect_workers`] named (the cluster is starting).
    pub fn settled_workers(&self) -> Option<Vec<NodeId>> {
        let live = self.live_workers();
        (live.len() >= self.expected_workers.load(Ordering::SeqCst)).then_some(live)
    }

    /// Waits until the workers [`Coordinator::expect_workers`] named have registered;
    /// once they have, the cluster counts as started and this returns at once.
    pub(super) async fn started(&self) -> Result<()> {
        let n = self.expected_workers.load(Ordering::SeqCst);
        if n == 0 {
            return Ok(());
        }
        self.wait_for_workers(n, STARTING_WAIT).await.map_err(|_| {
            exec_err(format!(
                "the cluster is starting: {} of its {n} workers registered within {STARTING_WAIT:?}",
                self.live_workers().len()
            ))
        })?;
        self.expected_workers.store(0, Ordering::SeqCst);
        Ok(())
    }

    pub async fn wait_for_workers(&self, n: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.live_workers().len() < n {
            if Instant::now() > deadline {
                return Err(exec_err(format!(
                    "only {} of {n} workers registered within {timeout:?}",
                    self.live_workers().len()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Declares dead the workers whose data connection broke or that sent no heartbeat
    /// for `heartbeat_timeout`, not counting the last `deaf` during which the
    /// coordinator could not have heard them.
    pub(super) fn check_members(&self, deaf: Duration) {
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let timeout = self.config.heartbeat_timeout;
        let now = Instant::now();
        let mut died = vec![];
        {
            let mut members = self.members.write();
            for (id, m) in members.iter_mut() {
                if !m.alive {
                    continue;
                }
                m.last_seen = (m.last_seen + deaf).min(now);
                let reason = if self.transport.is_lost(*id) {
                    Some(format!(
                        "{} at {} died (data connection lost)",
                        node_name(*id),
                        m.data_addr
                    ))
                } else if now.duration_since(m.last_seen) > timeout {
                    Some(format!(
                        "{} at {} died (no heartbeat for {:?})",
                        node_name(*id),
                        m.data_addr,
                        timeout
                    ))
                } else {
                    None
                };
                if let Some(reason) = reason {
                    m.alive = false;
                    m.death = Some(reason.clone());
                    died.push((*id, reason));
                }
            }
        }
        if !died.is_empty() {
            self.deaths.send_modify(|n| *n += died.len() as u64);
        }
        for (id, reason) in died {
            tracing::error!("{reason}");
            self.transport.forget_peer(id, &reason);
            for q in self.running.lock().values() {
                if q.workers.contains(&id) {
                    let _ = q.fail.send(reason.clone());
                }
            }
        }
    }

    /// Handles a control message from a worker.
    pub async fn handle_control(self: &Arc<Self>, req: Request) -> Result<Response> {
        match req {
            Request::Register {
                control_addr,
                data_addr,
                host_shuffle,
            } => {
                let data: SocketAddr = tokio::net::lookup_host(&data_addr)
                    .await?
                    .next()
                    .ok_or_else(|| exec_err(format!("cannot resolve {data_addr}")))?;
                let id = self.next_node.fetch_add(1, Ordering::SeqCst);
                let incarnation = rand::random();
                self.members.write().insert(
                    id,
                    Member {
                        control: ControlClient::connect_lazy(&control_addr, self.node_key(), id)?,
                        data_addr: data,
                        incarnation,
                        alive: true,
                        last_seen: Instant::now(),
                        death: None,
                        host_shuffle,
                    },
                );
                tracing::info!(node = id, %control_addr, %data_addr, "worker registered");
                // The new worker serves its control service only after this reply.
                let me = Arc::clone(self);
                tokio::spawn(async move { me.push_peers().await });
                Ok(Response::Registered {
                    node: id,
                    incarnation,
                })
            }
            Request::Heartbeat { node, incarnation } => {
                let mut members = self.members.write();
                let reason = match members.get_mut(&node) {
                    Some(m) if m.incarnation != incarnation => {
                        format!("the coordinator restarted and gave id {node} to another worker")
                    }
                    Some(m) if m.alive => {
                        m.last_seen = Instant::now();
                        return Ok(Response::Ok);
                    }
                    Some(m) => format!(
                        "{} was declared dead: {}",
                        node_name(node),
                        m.death.as_deref().unwrap_or("it left")
                    ),
                    None => format!(
                        "the coordinator does not know {} (it restarted)",
                        node_name(node)
                    ),
                };
                Ok(Response::Forgotten { reason })
            }
            Request::BenchShuffle(_) | Request::BenchJoin(_) => {
                super::bench::relay(self, req).await
            }
            Request::QueryFailed { query, error, .. } => {
                if let Some(q) = self.running.lock().get(&query) {
                    let _ = q.fail.send(error);
                }
                Ok(Response::Ok)
            }
            other => Err(exec_err(format!(
                "the coordinator does not handle {other:?}"
            ))),
        }
    }

    pub(super) async fn push_peers(&self) {
        let (peers, clients): (Vec<(NodeId, String)>, Vec<ControlClient>) = {
            let members = self.members.read();
            let mut peers: Vec<(NodeId, String)> = members
                .iter()
                .filter(|(_, m)| m.alive)
                .map(|(id, m)| (*id, m.data_addr.to_string()))
                .collect();
            peers.push((COORDINATOR, self.transport.local_addr().to_string()));
            let clients = members
                .values()
                .filter(|m| m.alive)
                .map(|m| m.control.clone())
                .collect();
            (peers, clients)
        };
        let map: HashMap<NodeId, SocketAddr> = self
            .members
            .read()
            .iter()
            .filter(|(_, m)| m.alive)
            .map(|(id, m)| (*id, m.data_addr))
            .collect();
        self.transport.set_peers(&map);
        let req = Request::SetPeers { peers };
        for c in clients {
            if let Err(e) = c.call(&req).await {
                tracing::warn!("cannot send the peer table to {}: {e}", c.addr());
            }
        }
    }

    pub(super) fn control(&self, node: NodeId) -> Result<ControlClient> {
        self.members
            .read()
            .get(&node)
            .map(|m| m.control.clone())
            .ok_or_else(|| exec_err(format!("unknown worker {node}")))
    }

    /// Sends `req` to `workers` (each within `timeout`, if given) and takes each
    /// reply's payload with `pick`; a reply it refuses, a worker that does not answer
    /// in time, or one declared dead while it is asked, is an error naming the worker
    /// and the `what` request.
    pub(super) async fn gather<T>(
        &self,
        workers: &[NodeId],
        req: Request,
        what: &str,
        timeout: Option<Duration>,
        pick: impl Fn(Response) -> std::result::Result<T, Box<Response>>,
    ) -> Result<Vec<T>> {
        let (pick, req) = (&pick, &req);
        let calls = workers.iter().map(|w| async move {
            let reply = self.call_worker(*w, req, what, timeout).await?;
            pick(reply).map_err(|other| {
                exec_err(format!(
                    "{} answered a {what} request with {other:?}",
                    node_name(*w)
                ))
            })
        });
        futures::future::try_join_all(calls).await
    }

    /// One control call to worker `w`. It ends when the worker answers, when `timeout`
    /// (if any) passes, or when the worker is declared dead (a stopped process answers
    /// nothing, but its heartbeats stop too): so no call waits on a silent worker for
    /// longer than the heartbeat timeout.
    pub(super) async fn call_worker(
        &self,
        w: NodeId,
        req: &Request,
        what: &str,
        timeout: Option<Duration>,
    ) -> Result<Response> {
        let c = self.control(w)?;
        let call = async {
            match timeout {
                Some(t) => tokio::time::timeout(t, c.call(req)).await.map_err(|_| {
                    exec_err(format!(
                        "{} did not answer a {what} request within {t:?}",
                        node_name(w)
                    ))
                })?,
                None => c.call(req).await,
            }
            .map_err(|e| exec_err(format!("{}: {e}", node_name(w))))
        };
        tokio::select! {
            reply = call => reply,
            death = self.death_of(w) => Err(exec_err(format!(
                "{} failed during a {what} request: {death}",
                node_name(w)
            ))),
        }
    }

    /// Why worker `w` is not a live member now, if it is not.
    pub(super) fn death_now(&self, w: NodeId) -> Option<String> {
        match self.members.read().get(&w) {
            None => Some(format!("{} is not a member", node_name(w))),
            Some(m) if !m.alive => Some(
                m.death
                    .clone()
                    .unwrap_or_else(|| format!("{} left", node_name(w))),
            ),
            Some(_) => None,
        }
    }

    /// Waits until worker `w` is declared dead (at once if it is) and says why.
    pub(super) async fn death_of(&self, w: NodeId) -> String {
        let mut deaths = self.deaths.subscribe();
        loop {
            if let Some(why) = self.death_now(w) {
                return why;
            }
            if deaths.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Sends `req` to every one of `workers` and waits for every reply, also after a
    /// refusal, so that what a caller sends to undo it (a `DropTable`, a `FinishQuery`)
    /// reaches no worker before `req` itself; a worker declared dead meanwhile fails
    /// the call, naming it. The first failure, in the order of `workers`, is returned.
    pub(super) async fn broadcast(
        &self,
        workers: &[NodeId],
        req: Request,
    ) -> Result<Vec<Response>> {
        let what = req.name();
        let calls = workers
            .iter()
            .map(|w| self.call_worker(*w, &req, what, None));
        futures::future::join_all(calls).await.into_iter().collect()
    }
}
