use super::*;

fn session(b: &mut TraceBuilder, id: &str, start: u64) -> SessionId {
    b.session(SessionSpec {
        id: id.into(),
        start_ms: Some(start),
        ..SessionSpec::default()
    })
    .unwrap()
}

fn agent(
    b: &mut TraceBuilder,
    s: SessionId,
    id: &str,
    parent: Option<&str>,
    turn: Option<usize>,
) -> AgentId {
    b.agent(
        s,
        AgentSpec {
            id: id.into(),
            agent_type: if parent.is_some() { "explore" } else { "main" }.into(),
            parent: parent.map(str::to_owned),
            spawned_by_turn: turn,
            ..AgentSpec::default()
        },
    )
    .unwrap()
}

fn req(at: u64, kind: TurnKind) -> RequestSpec {
    RequestSpec::new(at, 100, 10, kind)
}

#[test]
fn sessions_agents_and_requests_link_up() {
    let mut b = TraceBuilder::new(16).unwrap();
    // Session b starts earlier on the timeline than a: requests are regrouped by it.
    let sa = session(&mut b, "a", 1_000);
    let sb = session(&mut b, "b", 0);
    let main = agent(&mut b, sa, "main", None, None);
    b.request(main, req(0, TurnKind::First), &[1, 2]).unwrap();
    b.request(main, req(50, TurnKind::Handoff), &[1, 2, 3])
        .unwrap();
    let sub = agent(&mut b, sa, "x", Some("main"), Some(0));
    b.request(sub, req(10, TurnKind::Handoff), &[9]).unwrap();
    let mb = agent(&mut b, sb, "main", None, None);
    b.request(mb, req(5, TurnKind::First), &[1, 7]).unwrap();
    let t = b.build().unwrap();

    assert_eq!(t.sessions()[0].id, "b", "sessions ordered by first arrival");
    let order: Vec<(u64, &str)> = t
        .requests()
        .iter()
        .map(|r| (r.at_ms, t.agent(r.agent).id.as_str()))
        .collect();
    assert_eq!(
        order,
        vec![(5, "main"), (0, "main"), (10, "x"), (50, "main")]
    );
    let x = t.agents().iter().position(|a| a.id == "x").unwrap();
    let x = &t.agents()[x];
    let spawner = x.spawned_by.unwrap();
    assert_eq!(t.request(spawner).at_ms, 0);
    assert_eq!(t.turn_of(spawner), 0);
    assert_eq!(t.agent(x.parent.unwrap()).id, "main");
    assert_eq!(t.hash_ids(x.requests[0]), vec![9]);
    assert_eq!(t.arrival_ms(x.requests[0]), Some(1_010));
    let arrivals: Vec<u64> = t
        .by_arrival()
        .iter()
        .map(|&r| t.arrival_ms(r).unwrap())
        .collect();
    assert_eq!(arrivals, vec![5, 1_000, 1_010, 1_050]);
    for (i, r) in t.requests().iter().enumerate() {
        assert!(t.agent(r.agent).requests.contains(&RequestId(i as u32)));
        assert_eq!(t.agent(r.agent).session, r.session);
    }
}

#[test]
fn broken_models_are_refused_with_the_reason() {
    let mut b = TraceBuilder::new(16).unwrap();
    let s = session(&mut b, "s", 0);
    assert_eq!(
        b.session(SessionSpec {
            id: "s".into(),
            ..SessionSpec::default()
        }),
        Err(ModelError::DuplicateSession("s".into()))
    );
    let main = agent(&mut b, s, "main", None, None);
    assert!(matches!(
        b.agent(
            s,
            AgentSpec {
                id: "other".into(),
                ..AgentSpec::default()
            }
        ),
        Err(ModelError::TwoMains(_))
    ));
    assert!(matches!(
        b.agent(
            s,
            AgentSpec {
                id: "y".into(),
                parent: Some("nobody".into()),
                ..AgentSpec::default()
            }
        ),
        Err(ModelError::UnknownAgent { .. })
    ));
    b.request(main, req(100, TurnKind::First), &[]).unwrap();
    assert!(matches!(
        b.request(main, req(99, TurnKind::User), &[]),
        Err(ModelError::OutOfOrder {
            at_ms: 99,
            prev_ms: 100,
            ..
        })
    ));
    agent(&mut b, s, "late", Some("main"), Some(3));
    assert!(matches!(b.build(), Err(ModelError::EmptyAgent { .. })));

    let mut b = TraceBuilder::new(16).unwrap();
    let s = session(&mut b, "s", 0);
    let main = agent(&mut b, s, "main", None, None);
    b.request(main, req(0, TurnKind::First), &[]).unwrap();
    let sub = agent(&mut b, s, "late", Some("main"), Some(3));
    b.request(sub, req(1, TurnKind::Handoff), &[]).unwrap();
    assert!(matches!(
        b.build(),
        Err(ModelError::SpawnTurn {
            turn: 3,
            count: 1,
            ..
        })
    ));

    assert_eq!(TraceBuilder::new(0).err(), Some(ModelError::BlockSize));
    assert_eq!(
        TraceBuilder::new(16).unwrap().build().err(),
        Some(ModelError::NoRequests)
    );
    let mut b = TraceBuilder::new(16).unwrap();
    session(&mut b, "lonely", 0);
    let s2 = session(&mut b, "s2", 0);
    let m = agent(&mut b, s2, "main", None, None);
    b.request(m, req(0, TurnKind::First), &[]).unwrap();
    assert_eq!(b.build().err(), Some(ModelError::NoMain("lonely".into())));
}

#[test]
fn names_round_trip() {
    for e in EndReason::ALL {
        assert_eq!(EndReason::parse(e.name()), Some(e));
    }
}
