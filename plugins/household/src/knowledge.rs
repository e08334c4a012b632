//! The knowledge regime's hidden homes: where each kind of object lives in each kind of room.
//!
//! With `"knowledge": true` every target object of a task starts in an instance of its *home*
//! receptacle kind, one fixed kind per (room, object kind). The homes are a regularity of the
//! world, not of a task: the same for every layout, for the training and the held-out split,
//! and for every run seed, because a fixed hash with a constant salt ([`HOME_SALT`]) picks them.
//! Nothing in an observation gives a home away (the `unsearched :` list is a per-task shuffle,
//! see [`crate::world`]), so a policy learns them only from text knowledge (an experience such
//! as "in the kitchen the apple was on diningtable 1") or by absorbing them into its weights over
//! many episodes; without them it searches blindly.
//!
//! The home is drawn among the receptacle kinds plausible for the object in that room (its
//! catalog places that the room's pool holds), with containers (which must be opened before
//! their contents show) weighted [`HIDDEN_WEIGHT`] times as much as surfaces, so most homes
//! cost a blind searcher two steps per wrong guess. [`home_of`] is the public view; callers
//! are the generator ([`crate::world::generate`]) and tests.

use crate::catalog::{ObjectKind, RecKind, Room, OBJECTS};
use crate::rng::{fnv1a, mix, SplitMix64};

/// Salt of the home hash: a constant of the world, deliberately not the run seed, so the homes
/// never change between runs or splits. Changing it changes every knowledge-regime task.
pub(crate) const HOME_SALT: u64 = 0x6361_6972_6e2d_686f; // "cairn-ho"

/// How much more likely a container (cabinet, drawer, fridge) is to be a home than a surface.
pub(crate) const HIDDEN_WEIGHT: u32 = 3;

/// The home receptacle kind of objects of kind `object` in rooms of kind `room`, or `None` when
/// the object does not belong to that room.
pub(crate) fn home_kind(room: Room, object: &ObjectKind) -> Option<RecKind> {
    if !object.rooms.contains(&room) {
        return None;
    }
    let candidates: Vec<RecKind> = object
        .places
        .iter()
        .map(|&(k, _)| k)
        .filter(|&k| room.has(k))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let weights: Vec<u32> = candidates
        .iter()
        .map(|k| if k.openable() { HIDDEN_WEIGHT } else { 1 })
        .collect();
    let key = format!("{} {}", room.name(), object.name);
    let mut rng = SplitMix64::new(mix(HOME_SALT ^ fnv1a(&key)));
    Some(candidates[rng.weighted(&weights)])
}

/// The home receptacle kind (`"fridge"`, `"drawer"`, ...) of objects named `object` (`"apple"`)
/// in rooms named `room` (`"kitchen"`, `"bedroom"`, `"livingroom"`), as the knowledge regime
/// (`"knowledge": true`) places them. `None` for an unknown room or object, or an object that
/// does not belong to that room. The answer does not depend on any config: it is the world's.
pub fn home_of(room: &str, object: &str) -> Option<&'static str> {
    let room = Room::from_name(room)?;
    let object = OBJECTS.iter().find(|o| o.name == object)?;
    home_kind(room, object).map(RecKind::name)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::catalog::TaskKind;
    use crate::world::{places_for, Place, MIN_LISTED};
    use crate::{Household, HouseholdConfig};
    use cairn_plugin_sdk::{Split, TaskRef};

    /// Every (room, object) pair of the catalog has a home among its plausible kinds, and the
    /// hidden-first weighting shows: 14 of the 39 homes are containers.
    #[test]
    fn every_object_has_a_plausible_home_in_each_of_its_rooms() {
        let (mut homes, mut containers) = (0, 0);
        for room in Room::ALL {
            for object in OBJECTS {
                let home = home_kind(room, object);
                assert_eq!(
                    home.is_some(),
                    object.rooms.contains(&room),
                    "{}",
                    object.name
                );
                let Some(home) = home else { continue };
                assert!(
                    room.has(home) && object.weight_in(home) > 0,
                    "{}",
                    object.name
                );
                assert_eq!(home_of(room.name(), object.name), Some(home.name()));
                homes += 1;
                containers += u32::from(home.openable());
            }
        }
        assert_eq!((homes, containers), (39, 14));
    }

    /// The knowledge regime leaves out only targets with too few possible places, and every
    /// task kind keeps at least three target kinds in each of its rooms.
    #[test]
    fn the_regime_keeps_enough_targets() {
        let mut left_out = BTreeSet::new();
        for kind in TaskKind::ALL {
            for &room in kind.rooms() {
                let (mut kept, mut all) = (0, 0);
                for o in OBJECTS.iter().filter(|o| {
                    o.can & kind.requires() == kind.requires() && crate::catalog::found_in(o, room)
                }) {
                    all += 1;
                    if places_for(room, o) > MIN_LISTED {
                        kept += 1;
                    } else {
                        left_out.insert((room.name(), o.name));
                    }
                }
                assert!(
                    kept >= 3 && kept + 1 >= all,
                    "{} in {}",
                    kind.name(),
                    room.name()
                );
            }
        }
        assert_eq!(
            left_out.into_iter().collect::<Vec<_>>(),
            [("bedroom", "pillow"), ("livingroom", "pillow")]
        );
    }

    /// In both splits every target starts in an instance of its home kind that is not the
    /// destination, the room holds every plausible kind, the search order is a permutation,
    /// and one (room, target) pair has the same home in training and held-out tasks.
    #[test]
    fn every_task_starts_its_targets_at_home_in_both_splits() {
        let config = HouseholdConfig {
            knowledge: true,
            max_expert_steps: 20,
            ..HouseholdConfig::default()
        };
        let env = Household::new(config).expect("valid config");
        let mut starts: BTreeMap<(&str, &str), BTreeSet<(&str, &str)>> = BTreeMap::new();
        for (split, count) in [(Split::Train, 1_200), (Split::Test, 500)] {
            for index in 0..count {
                let task = env.generate(TaskRef { split, index }).expect("task");
                let (layout, goal) = (&task.layout, &task.goal);
                let target = &OBJECTS[goal.target];
                let home = home_kind(layout.room, target).expect("a home");
                for o in layout.objects.iter().filter(|o| o.kind == goal.target) {
                    let Place::At(r) = o.place else {
                        panic!("a target starts in hand")
                    };
                    assert_eq!(layout.receptacles[r].kind, home, "{}", task.signature());
                    assert_ne!(Some(r), goal.destination, "{}", task.signature());
                    starts
                        .entry((layout.room.name(), target.name))
                        .or_default()
                        .insert((split.as_str(), home.name()));
                }
                for &(k, _) in target.places.iter().filter(|&&(k, _)| layout.room.has(k)) {
                    assert!(
                        layout.find(k).is_some(),
                        "{} lacks {}",
                        task.signature(),
                        k.name()
                    );
                }
                let mut rank = task.search_rank.clone().expect("knowledge regime");
                rank.sort();
                assert_eq!(
                    rank,
                    (0..layout.receptacles.len() as u32).collect::<Vec<_>>()
                );
            }
        }
        let mut in_both = 0;
        for (pair, seen) in &starts {
            let kinds: BTreeSet<&str> = seen.iter().map(|&(_, k)| k).collect();
            assert_eq!(kinds.len(), 1, "{pair:?} starts in {kinds:?}");
            in_both += u32::from(seen.len() == 2);
        }
        assert_eq!(
            (starts.len(), in_both),
            (37, 37),
            "pairs seen, pairs in both splits"
        );
    }
}
