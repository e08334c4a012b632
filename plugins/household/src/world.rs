//! The world a task starts from, and the procedural generator that draws it.
//!
//! A [`Task`] is a [`Layout`] (one room: its receptacles, the objects in them, maybe a desk
//! lamp) plus a [`Goal`]. [`generate`] draws one from a [`SplitMix64`] stream and the
//! [`Knobs`]; the crate root decides which stream belongs to which `(split, index)`.
//!
//! The generator guarantees what the expert and the observations rely on: the target objects
//! lie on receptacles plausible for their kind, never already in the destination; the
//! destination is not the task's appliance; a light task's lamp stands on a desk or side table.
//!
//! With [`Knobs::knowledge`] (the knowledge regime) the draw differs in these places, and only
//! there (no other draw moves), so that with it off every task stays exactly as before:
//!
//! * every target object starts in an instance of its home kind ([`crate::knowledge`]),
//!   uniformly among those instances that are not the destination;
//! * the room holds every receptacle kind plausible for the target (so blind search has several
//!   kinds to try), and the destination's kind twice where the pool allows, whatever the home,
//!   so the room's make-up says nothing about the home;
//! * the destination is never the home kind when the room can hold only one of that kind;
//! * the room holds at least [`MIN_LISTED`] plausible places besides the destination (more
//!   instances of plausible kinds are added at random), and targets that cannot have that many
//!   are not drawn;
//! * after the layout, a per-task shuffle fixes the order of the `unsearched :` list
//!   ([`Task::search_rank`]), which therefore does not depend on the home.

use crate::catalog::{found_in, ObjectKind, RecKind, Room, TaskKind, OBJECTS};
use crate::knowledge::home_kind;
use crate::rng::SplitMix64;

/// Object numbers are drawn from `1..=MAX_OBJECT_NUMBER`, so a policy must read them from the
/// observation instead of assuming "apple 1".
const MAX_OBJECT_NUMBER: u32 = 4;
/// Knowledge regime: the fewest places the first `unsearched :` list names, so that blind
/// search has several to try. Targets whose room cannot hold that many besides a destination
/// (pillows: a bed or sofa and an armchair) are not drawn.
pub(crate) const MIN_LISTED: u32 = 3;

/// The generator's difficulty knobs (from the config).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Knobs {
    /// Receptacles in the room, inclusive range (raised to the task's required ones).
    pub receptacles: (u32, u32),
    /// Distractor objects (kinds other than the target), inclusive range.
    pub distractors: (u32, u32),
    /// The knowledge regime: targets start at their home kind, the search list is shuffled.
    pub knowledge: bool,
}

/// One receptacle instance: `cabinet 2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Receptacle {
    pub kind: RecKind,
    pub number: u32,
}

impl Receptacle {
    pub fn name(&self) -> String {
        format!("{} {}", self.kind.name(), self.number)
    }
}

/// An object's temperature, changed only by the microwave and the fridge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Temperature {
    Room,
    Hot,
    Cold,
}

/// Where an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// In or on the receptacle with this index into [`Layout::receptacles`].
    At(usize),
    /// In the agent's hands.
    Held,
}

/// One object instance: `apple 3`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Object {
    /// Index into [`OBJECTS`].
    pub kind: usize,
    pub number: u32,
    pub clean: bool,
    pub temperature: Temperature,
    pub place: Place,
}

impl Object {
    pub fn kind(&self) -> &'static ObjectKind {
        &OBJECTS[self.kind]
    }

    /// `apple 3`, the form actions use.
    pub fn name(&self) -> String {
        format!("{} {}", self.kind().name, self.number)
    }

    /// `hot clean apple 3`: the name with its visible states, the form observations use.
    pub fn description(&self) -> String {
        let temperature = match self.temperature {
            Temperature::Room => "",
            Temperature::Hot => "hot ",
            Temperature::Cold => "cold ",
        };
        let clean = if self.clean { "clean " } else { "" };
        format!("{temperature}{clean}{}", self.name())
    }
}

/// `a mug 1`, `an apple 2`, `a hot apple 2`.
pub(crate) fn with_article(phrase: &str) -> String {
    let article = if phrase.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {phrase}")
}

/// A room as generated: receptacles in canonical order (kind, then number), objects in the
/// order a receptacle lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub room: Room,
    pub receptacles: Vec<Receptacle>,
    pub objects: Vec<Object>,
    /// The receptacle `desklamp 1` stands on. The lamp is a fixture, not an object.
    pub lamp: Option<usize>,
}

impl Layout {
    /// The index of the (single) receptacle of `kind`; the generator puts the appliances a task
    /// needs in every room that task uses.
    pub fn find(&self, kind: RecKind) -> Option<usize> {
        self.receptacles.iter().position(|r| r.kind == kind)
    }
}

/// What the agent must achieve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Goal {
    pub kind: TaskKind,
    /// Index into [`OBJECTS`] of the target kind.
    pub target: usize,
    /// Receptacle index of the destination; `None` for light tasks.
    pub destination: Option<usize>,
}

impl Goal {
    /// Whether `object` counts towards the goal where it lies now: the target kind, in the
    /// destination, in the required state.
    pub fn satisfied_by(&self, object: &Object) -> bool {
        self.destination
            .is_some_and(|d| object.place == Place::At(d))
            && object.kind == self.target
            && self.state_met(object)
    }

    /// Whether `object` already has the state the task asks for (clean, hot, cold, or none).
    pub fn state_met(&self, object: &Object) -> bool {
        match self.kind {
            TaskKind::PickCleanThenPlace => object.clean,
            TaskKind::PickHeatThenPlace => object.temperature == Temperature::Hot,
            TaskKind::PickCoolThenPlace => object.temperature == Temperature::Cold,
            _ => true,
        }
    }

    /// The goal in words: `put a clean plate on countertop 1`.
    pub fn text(&self, layout: &Layout) -> String {
        let target = &OBJECTS[self.target];
        let Some(dest) = self.destination.map(|d| layout.receptacles[d]) else {
            return format!("examine the {} with the desklamp", target.name);
        };
        let thing = match self.kind {
            TaskKind::PickTwoObjAndPlace => format!("two {}", target.plural),
            TaskKind::PickCleanThenPlace => with_article(&format!("clean {}", target.name)),
            TaskKind::PickHeatThenPlace => with_article(&format!("hot {}", target.name)),
            TaskKind::PickCoolThenPlace => with_article(&format!("cold {}", target.name)),
            _ => with_article(target.name),
        };
        format!("put {thing} {} {}", dest.kind.preposition(), dest.name())
    }
}

/// A task: the starting layout and the goal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Task {
    pub layout: Layout,
    pub goal: Goal,
    /// Knowledge regime only: the rank of each receptacle in the `unsearched :` list, indexed
    /// like [`Layout::receptacles`] (`[receptacles]`, a permutation of `0..receptacles`), from a
    /// uniform shuffle drawn after the layout. `None` outside the regime, where the list is
    /// best-first by plausibility. Not part of the signature: the split rule keeps layouts and
    /// goals disjoint whatever the order.
    pub search_rank: Option<Vec<u32>>,
}

impl Task {
    /// A canonical text of everything that defines the task (room, each receptacle with its
    /// contents in order, the lamp, the goal). Two tasks are the same task iff their signatures
    /// are equal.
    pub fn signature(&self) -> String {
        let layout = &self.layout;
        let mut out = format!("{} |", layout.room.name());
        for (i, r) in layout.receptacles.iter().enumerate() {
            out.push_str(&format!(" {} :", r.name()));
            for o in layout.objects.iter().filter(|o| o.place == Place::At(i)) {
                out.push_str(&format!(" {}", o.description()));
            }
            out.push_str(" |");
        }
        if let Some(l) = layout.lamp {
            out.push_str(&format!(" desklamp at {} |", layout.receptacles[l].name()));
        }
        out.push_str(&format!(
            " goal {} : {}",
            self.goal.kind.name(),
            self.goal.text(layout)
        ));
        out
    }
}

/// Draws one task of `kind`.
pub(crate) fn generate(kind: TaskKind, knobs: &Knobs, rng: &mut SplitMix64) -> Task {
    let room = kind.rooms()[rng.below(kind.rooms().len())];
    let targets: Vec<usize> = (0..OBJECTS.len())
        .filter(|&i| {
            let o = &OBJECTS[i];
            o.can & kind.requires() == kind.requires() && found_in(o, room)
        })
        .filter(|&i| !knobs.knowledge || places_for(room, &OBJECTS[i]) > MIN_LISTED)
        .collect();
    let target = targets[rng.below(targets.len())];
    let target_kind = &OBJECTS[target];
    let home = if knobs.knowledge {
        Some(home_kind(room, target_kind).expect("a target kind belongs to its room"))
    } else {
        None
    };
    let drawn = draw_receptacles(kind, room, target_kind, home, knobs, rng);
    let receptacles = drawn.receptacles;
    let pick_instance = |rng: &mut SplitMix64, kind: RecKind| {
        let of: Vec<usize> = (0..receptacles.len())
            .filter(|&i| receptacles[i].kind == kind)
            .collect();
        of[rng.below(of.len())]
    };
    let destination = drawn.destination.map(|k| pick_instance(rng, k));
    let mut lamp = drawn.lamp_host.map(|k| pick_instance(rng, k));
    if lamp.is_none() && !room.lamp_hosts().is_empty() && rng.below(2) == 0 {
        let hosts: Vec<usize> = (0..receptacles.len())
            .filter(|&i| room.lamp_hosts().contains(&receptacles[i].kind))
            .collect();
        if !hosts.is_empty() {
            lamp = Some(hosts[rng.below(hosts.len())]);
        }
    }

    let mut objects = Vec::new();
    for _ in 0..kind.needed() {
        let placed = match home {
            Some(home) => place_at_home(rng, &receptacles, home, destination),
            None => place(rng, &receptacles, target_kind, destination),
        };
        let at = placed.expect("the source receptacle is plausible and not the destination");
        objects.push(new_object(rng, &objects, target, at));
    }
    let distractor_kinds: Vec<usize> = (0..OBJECTS.len())
        .filter(|&i| i != target && found_in(&OBJECTS[i], room))
        .collect();
    let distractors = rng.range(knobs.distractors.0, knobs.distractors.1);
    for _ in 0..distractors {
        let k = distractor_kinds[rng.below(distractor_kinds.len())];
        let taken = objects.iter().filter(|o: &&Object| o.kind == k).count();
        if taken as u32 >= MAX_OBJECT_NUMBER {
            continue;
        }
        if let Some(at) = place(rng, &receptacles, &OBJECTS[k], None) {
            objects.push(new_object(rng, &objects, k, at));
        }
    }
    rng.shuffle(&mut objects);
    let search_rank = knobs.knowledge.then(|| {
        let mut order: Vec<usize> = (0..receptacles.len()).collect();
        rng.shuffle(&mut order);
        let mut rank = vec![0u32; receptacles.len()];
        for (position, &r) in order.iter().enumerate() {
            rank[r] = position as u32;
        }
        rank
    });

    Task {
        layout: Layout {
            room,
            receptacles,
            objects,
            lamp,
        },
        goal: Goal {
            kind,
            target,
            destination,
        },
        search_rank,
    }
}

/// The receptacles of a room, and the kinds chosen for the destination and the lamp.
struct DrawnReceptacles {
    /// In canonical order: by kind, then number.
    receptacles: Vec<Receptacle>,
    destination: Option<RecKind>,
    lamp_host: Option<RecKind>,
}

/// Chooses how many receptacles of each kind the room has: its fixtures, whatever the task
/// needs (appliance, lamp host, destination, a separate source for the target), then random
/// kinds up to the drawn size. With a `home` (the knowledge regime) the source is the home kind
/// and the room also holds every kind plausible for the target.
fn draw_receptacles(
    kind: TaskKind,
    room: Room,
    target: &ObjectKind,
    home: Option<RecKind>,
    knobs: &Knobs,
    rng: &mut SplitMix64,
) -> DrawnReceptacles {
    let places: Vec<(RecKind, u32)> = target
        .places
        .iter()
        .copied()
        .filter(|&(k, _)| room.has(k))
        .collect();
    // Receptacle counts per kind, in pool order.
    let pool = room.pool();
    let mut counts = vec![0u32; pool.len()];
    let slot = |kind: RecKind| {
        pool.iter()
            .position(|&(k, _)| k == kind)
            .expect("kind in pool")
    };
    let ensure = |counts: &mut Vec<u32>, kind: RecKind, at_least: u32| {
        let i = slot(kind);
        counts[i] = counts[i].max(at_least.min(pool[i].1));
    };
    for &fixture in room.fixtures() {
        ensure(&mut counts, fixture, 1);
    }
    if let Some(appliance) = kind.appliance() {
        ensure(&mut counts, appliance, 1);
    }
    let lamp_host = match kind {
        TaskKind::LookAtObjInLight => {
            let hosts = room.lamp_hosts();
            let host = hosts[rng.below(hosts.len())];
            ensure(&mut counts, host, 1);
            Some(host)
        }
        _ => None,
    };
    let destination = match kind {
        TaskKind::LookAtObjInLight => None,
        _ => {
            let options: Vec<RecKind> = places
                .iter()
                .map(|&(k, _)| k)
                .filter(|&k| Some(k) != kind.appliance())
                // The home's only instance cannot be the destination: the targets start there.
                .filter(|&k| Some(k) != home || room.most(k) >= 2)
                .collect();
            let k = options[rng.below(options.len())];
            // In the knowledge regime the destination kind comes twice (where the pool allows)
            // whether or not it is the home, so two of a kind never point at the home.
            ensure(&mut counts, k, if home.is_some() { 2 } else { 1 });
            Some(k)
        }
    };
    if let Some(home) = home {
        for &(k, _) in &places {
            ensure(&mut counts, k, 1);
        }
        ensure(
            &mut counts,
            home,
            if Some(home) == destination { 2 } else { 1 },
        );
        // Several places to search: add instances of random plausible kinds until the list
        // (every plausible instance but the destination) has MIN_LISTED.
        loop {
            let plausible: u32 = places.iter().map(|&(k, _)| counts[slot(k)]).sum();
            if plausible - u32::from(destination.is_some()) >= MIN_LISTED {
                break;
            }
            let open: Vec<usize> = places
                .iter()
                .map(|&(k, _)| slot(k))
                .filter(|&i| counts[i] < pool[i].1)
                .collect();
            if open.is_empty() {
                break;
            }
            counts[open[rng.below(open.len())]] += 1;
        }
    } else {
        // A source: some plausible receptacle besides the destination instance.
        let sources: Vec<(RecKind, u32)> = places
            .iter()
            .copied()
            .filter(|&(k, _)| Some(k) != destination || pool[slot(k)].1 >= 2)
            .collect();
        let weights: Vec<u32> = sources.iter().map(|&(_, w)| w).collect();
        let source = sources[rng.weighted(&weights)].0;
        ensure(
            &mut counts,
            source,
            if Some(source) == destination { 2 } else { 1 },
        );
    }
    // Fill up to the drawn size with random kinds that still have room.
    let size = rng.range(knobs.receptacles.0, knobs.receptacles.1);
    while counts.iter().sum::<u32>() < size {
        let open: Vec<usize> = (0..pool.len()).filter(|&i| counts[i] < pool[i].1).collect();
        if open.is_empty() {
            break;
        }
        let i = open[rng.below(open.len())];
        counts[i] += 1;
    }

    let mut kinds: Vec<(RecKind, u32)> = pool
        .iter()
        .zip(&counts)
        .map(|(&(k, _), &n)| (k, n))
        .collect();
    kinds.sort();
    let receptacles = kinds
        .iter()
        .flat_map(|&(kind, n)| (1..=n).map(move |number| Receptacle { kind, number }))
        .collect();
    DrawnReceptacles {
        receptacles,
        destination,
        lamp_host,
    }
}

/// How many receptacles plausible for `object` a room of kind `room` can hold at most.
pub(crate) fn places_for(room: Room, object: &ObjectKind) -> u32 {
    object.places.iter().map(|&(k, _)| room.most(k)).sum()
}

/// Picks a receptacle for an object of `kind`, weighted by plausibility, avoiding `exclude`.
fn place(
    rng: &mut SplitMix64,
    receptacles: &[Receptacle],
    kind: &ObjectKind,
    exclude: Option<usize>,
) -> Option<usize> {
    let weights: Vec<u32> = receptacles
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if Some(i) == exclude {
                0
            } else {
                kind.weight_in(r.kind)
            }
        })
        .collect();
    (weights.iter().sum::<u32>() > 0).then(|| rng.weighted(&weights))
}

/// Picks, uniformly, an instance of the `home` kind other than `exclude` (the knowledge
/// regime's target placement).
fn place_at_home(
    rng: &mut SplitMix64,
    receptacles: &[Receptacle],
    home: RecKind,
    exclude: Option<usize>,
) -> Option<usize> {
    let options: Vec<usize> = (0..receptacles.len())
        .filter(|&i| receptacles[i].kind == home && Some(i) != exclude)
        .collect();
    (!options.is_empty()).then(|| options[rng.below(options.len())])
}

/// A fresh object of kind `kind` at receptacle `at`, numbered apart from its siblings.
fn new_object(rng: &mut SplitMix64, existing: &[Object], kind: usize, at: usize) -> Object {
    let free: Vec<u32> = (1..=MAX_OBJECT_NUMBER)
        .filter(|n| !existing.iter().any(|o| o.kind == kind && o.number == *n))
        .collect();
    Object {
        kind,
        number: free[rng.below(free.len())],
        clean: false,
        temperature: Temperature::Room,
        place: Place::At(at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOBS: Knobs = Knobs {
        receptacles: (6, 9),
        distractors: (2, 5),
        knowledge: false,
    };

    #[test]
    fn generated_tasks_keep_the_generator_promises() {
        for kind in TaskKind::ALL {
            for seed in 0..300 {
                let task = generate(kind, &KNOBS, &mut SplitMix64::new(seed));
                let (layout, goal) = (&task.layout, &task.goal);
                let targets: Vec<&Object> = layout
                    .objects
                    .iter()
                    .filter(|o| o.kind == goal.target)
                    .collect();
                assert_eq!(targets.len(), kind.needed(), "{}", task.signature());
                for t in &targets {
                    let Place::At(r) = t.place else {
                        panic!("generated object held")
                    };
                    assert_ne!(Some(r), goal.destination, "{}", task.signature());
                    assert!(OBJECTS[goal.target].weight_in(layout.receptacles[r].kind) > 0);
                }
                if let Some(appliance) = kind.appliance() {
                    assert!(layout.find(appliance).is_some());
                    assert_ne!(
                        goal.destination.map(|d| layout.receptacles[d].kind),
                        Some(appliance)
                    );
                }
                assert_eq!(
                    goal.destination.is_none(),
                    kind == TaskKind::LookAtObjInLight
                );
                if kind == TaskKind::LookAtObjInLight {
                    assert!(layout.lamp.is_some());
                }
                let n = layout.receptacles.len();
                assert!(
                    (6..=12).contains(&n),
                    "{n} receptacles: {}",
                    task.signature()
                );
                let mut names: Vec<String> = layout.objects.iter().map(Object::name).collect();
                names.sort();
                names.dedup();
                assert_eq!(names.len(), layout.objects.len(), "duplicate object names");
            }
        }
    }

    #[test]
    fn goal_texts_read_naturally() {
        let layout = Layout {
            room: Room::Kitchen,
            receptacles: vec![
                Receptacle {
                    kind: RecKind::Countertop,
                    number: 1,
                },
                Receptacle {
                    kind: RecKind::Drawer,
                    number: 2,
                },
            ],
            objects: vec![],
            lamp: None,
        };
        let apple = OBJECTS.iter().position(|o| o.name == "apple").unwrap();
        let knife = OBJECTS.iter().position(|o| o.name == "knife").unwrap();
        let check = |kind, target, destination, expected: &str| {
            assert_eq!(
                Goal {
                    kind,
                    target,
                    destination
                }
                .text(&layout),
                expected
            );
        };
        check(
            TaskKind::PickAndPlace,
            apple,
            Some(0),
            "put an apple on countertop 1",
        );
        check(
            TaskKind::PickHeatThenPlace,
            apple,
            Some(0),
            "put a hot apple on countertop 1",
        );
        check(
            TaskKind::PickTwoObjAndPlace,
            knife,
            Some(1),
            "put two knives in drawer 2",
        );
        check(
            TaskKind::LookAtObjInLight,
            apple,
            None,
            "examine the apple with the desklamp",
        );
    }
}
